"""Sum over rows (dim 0) of a 2048x2048 fp32 tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x.sum(dim=0)


def get_inputs():
    return [torch.randn(2048, 2048)]


def get_init_inputs():
    return []
