import torch
import torch.nn as nn


class Model(nn.Module):
    """24 rounds of x = x * 0.5 + 0.25 on a small vector."""

    def forward(self, x):
        for _ in range(24):
            x = x * 0.5 + 0.25
        return x


def get_inputs():
    return [torch.randn(4096, device="cuda")]


def get_init_inputs():
    return []
