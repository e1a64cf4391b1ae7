"""relu(x * 1.5 + 0.25) in three parallel, simd passes over the whole tensor, through two temporary arrays
(reference ref_scale_shift_relu: 64 MiB in, 64 MiB out, larger than the last-level cache).

Each pass stores its result and the next loads it back, so the loops move three times the bytes one loop would.
Right first advice: merge the three passes into one loop (the intermediates stay in registers).
Already there: `#pragma omp parallel for simd` on every loop, one extension call for the whole forward (must
not be advised again).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor scale_shift_relu(torch::Tensor x) {
    auto xc = x.contiguous();
    auto t = torch::empty_like(xc);
    auto u = torch::empty_like(xc);
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* tp = t.data_ptr<float>();
    float* up = u.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = xc.numel();
    #pragma omp parallel for simd
    for (int64_t i = 0; i < n; ++i) tp[i] = in[i] * 1.5f;
    #pragma omp parallel for simd
    for (int64_t i = 0; i < n; ++i) up[i] = tp[i] + 0.25f;
    #pragma omp parallel for simd
    for (int64_t i = 0; i < n; ++i) o[i] = up[i] > 0.f ? up[i] : 0.f;
    return out;
}
"""

ext = load_inline(name="kforge_analyst_multipass", cpp_sources=cpp_source, functions=["scale_shift_relu"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.scale_shift_relu(x)
