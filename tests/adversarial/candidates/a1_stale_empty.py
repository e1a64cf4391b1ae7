"""A1 stale memory (problem relu): returns an allocation it never writes, hoping it holds an old answer."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.empty_like(x)
