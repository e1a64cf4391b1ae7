"""B2 thread out of Python's sight (problem relu): the answer is right, and a thread started through the
`_thread` module, which `threading.enumerate` does not list, keeps a core busy after the call returns (work
the timing would not pay for). The server's own look at the worker's threads in /proc catches it."""
import importlib
import time

import torch
import torch.nn as nn

_started = []


def _spin():
    # Long past any profile on a loaded 2-core host (30 s ran out before a CI profile's last round, which then
    # saw nothing): a worker found with it is killed, not kept, so the thread ends with its process.
    end = time.monotonic() + 600
    while time.monotonic() < end:
        pass


class ModelNew(nn.Module):
    def forward(self, x):
        if not _started:
            importlib.import_module("_" + "thread").start_new_thread(_spin, ())
            _started.append(True)
        return torch.relu(x)
