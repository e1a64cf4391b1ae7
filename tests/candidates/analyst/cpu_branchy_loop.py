"""Signed square root: a parallel loop whose body branches (`if` / `else` with a `std::sqrt` call), which GCC
does not vectorize ("control flow in loop"; reference ref_signed_sqrt).

Right first advice: make the loop vectorize: `-fno-trapping-math -fno-math-errno` so GCC may compute both sides
and select per lane (with them this loop vectorizes; tests/test_analyst_code.py checks it with g++).
Already there: `#pragma omp parallel for`, one extension call for the whole forward (must not be advised again).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor signed_sqrt(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = xc.numel();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) {
        if (in[i] > 0.f) o[i] = in[i] * 2.f;
        else o[i] = std::sqrt(-in[i]);
    }
    return out;
}
"""

ext = load_inline(name="kforge_analyst_branchy", cpp_sources=cpp_source, functions=["signed_sqrt"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.signed_sqrt(x)
