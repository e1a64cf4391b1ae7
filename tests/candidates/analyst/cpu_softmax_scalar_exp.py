"""Row softmax, already parallel over rows and `omp simd` on every inner loop; its exp stays a scalar libm call.

Right first advice: make exp vectorize (a vector exp: -ffast-math/-fno-math-errno with -march=native so GCC
calls glibc's libmvec, or a polynomial exp in the simd loop); the built library imports expf.
Already there: `#pragma omp parallel for`, `#pragma omp simd` (must not be advised again).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor softmax_rows(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t rows = xc.size(0), cols = xc.size(1);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    #pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * cols;
        float* orow = o + r * cols;
        float m = -INFINITY;
        #pragma omp simd reduction(max:m)
        for (int64_t c = 0; c < cols; ++c) m = std::max(m, row[c]);
        float sum = 0.f;
        #pragma omp simd reduction(+:sum)
        for (int64_t c = 0; c < cols; ++c) { const float e = std::exp(row[c] - m); orow[c] = e; sum += e; }
        const float inv = 1.f / sum;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) orow[c] *= inv;
    }
    return out;
}
"""

ext = load_inline(name="kforge_analyst_softmax", cpp_sources=cpp_source, functions=["softmax_rows"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.softmax_rows(x)
