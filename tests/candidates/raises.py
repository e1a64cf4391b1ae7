"""EXCEPTION: a shape bug that raises in forward."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return x @ self.scale.view(1, -1)  # line 12: wrong shapes
