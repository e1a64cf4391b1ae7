"""A11 behaves differently while timed (problem relu): honest for the first calls (the correctness
phase), then returns a buffer it never fills."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls <= 12:
            return torch.relu(x)
        return torch.zeros_like(x)
