"""Honest: fp32 matmul summed over 64-wide blocks of K (adversarial problem matmul): a different summation
order than the reference, which the float64-relative bound must accept."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype)
        for k in range(0, a.shape[1], 64):
            out += a[:, k:k + 64] @ b[k:k + 64]
        return out
