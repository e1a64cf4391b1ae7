"""Ten affine steps (x * 1.01 + 0.001 * step) on 256 floats: tiny work, many ops."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        for step in range(10):
            x = x * 1.01 + 0.001 * step
        return x


def get_inputs():
    return [torch.randn(256)]


def get_init_inputs():
    return []
