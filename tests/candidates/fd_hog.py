"""FD HOG: opens files until the process has no descriptor left, and keeps them: the harness's next file (the
outputs' handoff, a log) fails. Must be the candidate's failure with the limit named, not a KForge error."""
import os

import torch
import torch.nn as nn

_held = []
try:
    while True:
        _held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
