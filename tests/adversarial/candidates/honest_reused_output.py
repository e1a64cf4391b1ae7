"""Honest (problem relu): writes every answer into one preallocated output buffer and returns it, as
kernels that avoid an allocation per call do. Each returned tensor is right when it is returned; a later
call overwrites it. A harness must save a timed output before it calls the model again."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = None

    def forward(self, x):
        if self.out is None or self.out.shape != x.shape:
            self.out = torch.empty_like(x)
        return torch.clamp(x, min=0, out=self.out)
