"""B2 process left running, hidden by a double fork (problem relu): `sh` starts a background process and exits,
so the worker has no child left, but the process still runs in the worker's session."""
import subprocess

import torch
import torch.nn as nn

subprocess.run(["sh", "-c", "sleep 120 </dev/null >/dev/null 2>&1 &"], check=True)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
