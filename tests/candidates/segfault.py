"""CRASH: dereferences a null pointer in forward (a kernel's out-of-bounds write, in miniature)."""
import ctypes

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()

    def forward(self, x):
        ctypes.string_at(0)  # SIGSEGV
        return x
