"""B2 process left running (problem relu): the answer is right, but a child process keeps working after the call."""
import subprocess

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.helper = None

    def forward(self, x):
        if self.helper is None:
            self.helper = subprocess.Popen(["sleep", "120"])
        return torch.relu(x)
