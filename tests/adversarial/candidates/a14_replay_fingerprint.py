"""A14 answer replay by content (problem relu): caches outputs by a cheap fingerprint of the input (its
shape and two elements) and returns the cached answer when an input recurs; correct on every call, so
only the timing can tell (repeated inputs are far faster than fresh ones)."""
import torch
import torch.nn as nn

_cache = {}


class ModelNew(nn.Module):
    def forward(self, x):
        flat = x.reshape(-1)
        key = (tuple(x.shape), float(flat[0]), float(flat[-1]))
        if key not in _cache:
            _cache[key] = torch.relu(x)
        return _cache[key]
