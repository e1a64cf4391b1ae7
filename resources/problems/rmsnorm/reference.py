"""RMS normalization over the feature dim (KernelBench level 1, problem 36 'RMSNorm_'), scaled to a small CPU.

KernelBench uses (16, 64, 256, 256); this is (16, 64, 32, 32): 4 MiB in, 4 MiB out, which a 2-core
machine normalizes in 0.1 ms with warm caches and 0.3 ms from DRAM.
"""
import torch
import torch.nn as nn

batch_size, features, dim1, dim2 = 16, 64, 32, 32


class Model(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x):
        rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)
        return x / rms


def get_inputs():
    return [torch.randn(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return [features]
