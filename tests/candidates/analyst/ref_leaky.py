"""Leaky ReLU (slope 0.01) of a 2048x2048 fp32 tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.leaky_relu(x, 0.01)


def get_inputs():
    return [torch.randn(2048, 2048)]


def get_init_inputs():
    return []
