"""A3 constant output (adversarial problem softmax_long): every true output is below fp32's atol."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
