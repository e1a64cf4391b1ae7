"""EXIT, but only inside the profile's torch.profiler window: correct when checked and timed, then the process
leaves without a word. The profile must report how it ended, not a KForge error."""
import os

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        if torch.autograd.profiler._is_profiler_enabled:
            os._exit(3)
        return torch.relu(x) * self.scale + self.bias
