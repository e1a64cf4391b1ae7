"""Linear layer followed by GELU (KernelBench level 2 style fusion target), batch 128, 512 -> 1024."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x))


def get_inputs():
    return [torch.randn(128, 512)]


def get_init_inputs():
    return [512, 1024]
