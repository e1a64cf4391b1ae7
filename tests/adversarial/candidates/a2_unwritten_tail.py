"""A2 partial write (problem relu): computes the first half of the output and leaves the rest as it was."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        half = x.shape[0] // 2
        out[:half] = torch.relu(x[:half])
        return out
