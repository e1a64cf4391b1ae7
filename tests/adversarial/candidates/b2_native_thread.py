"""B2 thread out of Python's sight (problem relu): the answer is right, and a thread started through the
`_thread` module, which `threading.enumerate` does not list, keeps a core busy after the call returns (work
the timing would not pay for). The server's own look at the worker's threads in /proc catches it."""
import importlib
import time

import torch
import torch.nn as nn

_started = []


def _spin():
    end = time.monotonic() + 30
    while time.monotonic() < end:
        pass


class ModelNew(nn.Module):
    def forward(self, x):
        if not _started:
            importlib.import_module("_" + "thread").start_new_thread(_spin, ())
            _started.append(True)
        return torch.relu(x)
