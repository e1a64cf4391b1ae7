"""Degenerate (KernelBench level2/80 style): max over dim 1 with keepdim, minus its own mean over dim 1,
is identically zero, and GELU(0) = 0. Any candidate that returns zeros is right."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = self.linear(x)
        m = torch.max(y, dim=1, keepdim=True).values
        return torch.nn.functional.gelu(m - m.mean(dim=1, keepdim=True))


def get_inputs():
    return [torch.randn(64, 128)]


def get_init_inputs():
    return [128, 256]
