"""MEMORY: tries to allocate far more memory than the worker may use."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()

    def forward(self, x):
        hog = torch.ones(64 * 1024**3 // 4)  # 64 GiB
        return x + hog[0]
