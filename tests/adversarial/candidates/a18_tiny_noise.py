"""A18 nondeterministic within tolerance (problem relu): where the output is zero it adds 1e-9 times a call
count, so two runs on the same inputs differ bitwise while both stay correct (as atomics or unordered sums do)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.relu(x) + (x <= 0) * (self.calls * 1e-9)
