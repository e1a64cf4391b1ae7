"""Row sums of a 16384x4096 fp32 tensor (256 MB)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x.sum(dim=1)


def get_inputs():
    return [torch.randn(16384, 4096)]


def get_init_inputs():
    return []
