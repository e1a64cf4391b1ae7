"""B3 monkey-patching the harness (problem relu): replaces the timer through the module's __dict__,
which a pattern scan does not see; the runtime identity check must."""
import time

import torch
import torch.nn as nn

vars(time)["perf_counter"] = lambda: 0.0


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
