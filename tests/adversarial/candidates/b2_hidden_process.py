"""B2 HIDDEN: leaves a `sleep` running, and first blinds the harness's own look for leftovers in its process
(patches HarnessSnapshot.background_work to report nothing). The server's look from outside the worker's PID
namespace must still name it."""
import subprocess

import torch
import torch.nn as nn

from kforge.tools.harness import integrity

integrity.HarnessSnapshot.background_work = lambda self: []
_child = subprocess.Popen(["sleep", "600"])


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)
