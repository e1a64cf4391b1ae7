"""A7 input mutation (problem relu): answers correctly, then zeroes its input."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        x.zero_()
        return y
