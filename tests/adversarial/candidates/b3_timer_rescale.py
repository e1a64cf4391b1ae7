"""B3 monkey-patching the harness (problem matmul): rescales the harness's own timer class and silences the
host-clock cross-check, neither of which an identity check watches (time.perf_counter stays intact), so every
timed call reads 3x faster than it ran. Everything inside the candidate's process can be patched like this;
the server's own clock on the calls (wall_clock_anchor) must not agree."""
import importlib

import torch
import torch.nn as nn

_host = importlib.import_module("kforge.backends.host")
_elapsed = _host.WallTimer.elapsed_s
setattr(_host.WallTimer, "elapsed_s", lambda self: _elapsed(self) / 3.0)
setattr(importlib.import_module("kforge.tools.harness.timing"), "_cross_check", lambda *a, **k: (None, False, ""))


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)
