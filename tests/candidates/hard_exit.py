"""EXIT: leaves the process without a word, as os._exit or exit() in native code would."""
import os

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()

    def forward(self, x):
        os._exit(3)
