"""Reference for the CPU example: y = relu(x) * scale + bias (a fused elementwise op)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return torch.relu(x) * self.scale + self.bias


def get_inputs():
    return [torch.randn(512, 2048)]


def get_init_inputs():
    return [2048]
