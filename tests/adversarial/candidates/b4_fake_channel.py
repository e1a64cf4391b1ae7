"""B4 result-channel tampering (problem relu): writes a fake "all correct" reply to every descriptor,
then returns a wrong answer."""
import json
import os

import torch
import torch.nn as nn

_FAKE = (json.dumps({"ok": True, "trials": [], "weights": {"copied": 0, "reference_total": 0}}) + "\n").encode()


class ModelNew(nn.Module):
    def forward(self, x):
        for fd in range(3, 64):
            try:
                os.write(fd, _FAKE)
            except OSError:
                pass
        return torch.zeros_like(x)
