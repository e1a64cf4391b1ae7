"""B3 on a GPU (problem matmul, made device-bound): rescales the harness's CUDA event timer and silences the
host-clock cross-check, so every timed call reads 3x faster than it ran. The judge's launch floor, allowed on top
of the median for launch-bound kernels, must not hide it: the server's clock on the calls (wall_clock_anchor)
still disagrees."""
import importlib

import torch
import torch.nn as nn

_nvidia = importlib.import_module("kforge.backends._nvidia")
_elapsed = _nvidia.EventTimer.elapsed_s
setattr(_nvidia.EventTimer, "elapsed_s", lambda self: _elapsed(self) / 3.0)
setattr(importlib.import_module("kforge.tools.harness.timing"), "_cross_check", lambda *a, **k: (None, False, ""))


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)
