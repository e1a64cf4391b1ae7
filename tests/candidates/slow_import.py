"""Correct for `relu`, but takes a few seconds to import: a job that outlasts a short wait."""
import time

import torch
import torch.nn as nn

time.sleep(6)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.clamp_min(x, 0.0)
