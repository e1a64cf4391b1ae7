"""Softmax over rows of 65536: every output is about 1.5e-5, below fp32's atol of 1e-4, so zeros pass an
element-wise check (KernelBench level1/23 has the same property)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [0.1 * torch.randn(16, 65536)]


def get_init_inputs():
    return []
