"""A13 lazy tensor (problem relu): returns a torch.Tensor subclass that computes when compared."""
import torch
import torch.nn as nn


class Lazy(torch.Tensor):
    pass


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x).as_subclass(Lazy)
