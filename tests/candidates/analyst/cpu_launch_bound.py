"""A chain of ten tiny elementwise steps, each its own extension call on 256 floats.

Right first advice: fuse the small calls into one kernel (each call costs dispatch overhead, not work).
Already there: each step's loop is simple and vectorizes; there is nothing to parallelize at this size.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor affine(torch::Tensor x, double scale, double shift) {
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float s = static_cast<float>(scale), t = static_cast<float>(shift);
    for (int64_t i = 0; i < x.numel(); ++i) o[i] = in[i] * s + t;
    return out;
}
"""

ext = load_inline(name="kforge_analyst_tiny", cpp_sources=cpp_source, functions=["affine"])


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        for step in range(10):
            x = ext.affine(x, 1.01, 0.001 * step)
        return x
