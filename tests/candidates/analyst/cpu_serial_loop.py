"""Leaky ReLU as one serial C++ loop (problem pack 'relu' shape).

Right first advice: parallelize the loop over elements (it runs on one core).
Already there: nothing to add but threads; the loop vectorizes.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = xc.numel();
    for (int64_t i = 0; i < n; ++i) {
        const float v = in[i];
        o[i] = v > 0.f ? v : 0.01f * v;
    }
    return out;
}
"""

ext = load_inline(name="kforge_analyst_serial", cpp_sources=cpp_source, functions=["leaky"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.leaky(x)
