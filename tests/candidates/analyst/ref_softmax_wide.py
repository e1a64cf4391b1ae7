"""Row softmax of a 512x16384 fp32 tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(512, 16384)]


def get_init_inputs():
    return []
