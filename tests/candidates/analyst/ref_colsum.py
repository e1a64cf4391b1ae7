"""Sum over rows (dim 0) of a 2048x2048 fp32 tensor.

Positive inputs: the candidate's plain sequential float32 sum of randn rows missed atol=1e-4 where a column's sum
was near zero, on about 1 seed in 200 (a CI flake); its advice, not its rounding, is what these tests are about."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x.sum(dim=0)


def get_inputs():
    return [torch.rand(2048, 2048)]


def get_init_inputs():
    return []
