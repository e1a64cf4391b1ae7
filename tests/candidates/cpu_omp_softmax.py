"""Row-wise softmax as one OpenMP C++ loop over rows (KernelBench format; problem pack 'softmax')."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "x must be a 2-D float32 tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t rows = xc.size(0), cols = xc.size(1);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    #pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * cols;
        float* orow = o + r * cols;
        float m = row[0];
        for (int64_t c = 1; c < cols; ++c) m = row[c] > m ? row[c] : m;
        float sum = 0.f;
        for (int64_t c = 0; c < cols; ++c) { orow[c] = std::exp(row[c] - m); sum += orow[c]; }
        const float inv = 1.f / sum;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) orow[c] *= inv;
    }
    return out;
}
"""

softmax = load_inline(
    name="kforge_bench_softmax",
    cpp_sources=cpp_source,
    functions=["softmax_rows"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return softmax.softmax_rows(x)
