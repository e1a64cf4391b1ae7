"""A 9-tap weighted moving sum along the rows of a 16384x4096 fp32 tensor, zero-padded:
out[r, i] = sum_k w[k] * x[r, i + k - 4]. Elementwise ops only (a conv1d would run in TF32 under cuDNN's default)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, w):
        taps, cols = w.numel(), x.shape[1]
        xp = torch.nn.functional.pad(x, (taps // 2, taps // 2))
        out = w[0] * xp[:, 0:cols]
        for k in range(1, taps):
            out = out + w[k] * xp[:, k:k + cols]
        return out


def get_inputs():
    return [torch.randn(16384, 4096), torch.randn(9) / 3]


def get_init_inputs():
    return []
