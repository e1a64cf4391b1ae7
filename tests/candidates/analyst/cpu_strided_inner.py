"""Column sums with a parallel outer loop over columns and a strided inner loop over rows.

Right first advice: make the inner loop unit-stride (interchange the loops: walk rows outside, columns inside).
Already there: `#pragma omp parallel for` on the outer loop (must not be advised again).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor colsum(torch::Tensor x) {
    auto xc = x.contiguous();
    const int64_t rows = xc.size(0), cols = xc.size(1);
    auto out = torch::empty({cols}, xc.options());
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    #pragma omp parallel for
    for (int64_t j = 0; j < cols; ++j) {
        float acc = 0.f;
        for (int64_t i = 0; i < rows; ++i) {
            acc += in[i * cols + j];
        }
        o[j] = acc;
    }
    return out;
}
"""

ext = load_inline(name="kforge_analyst_strided", cpp_sources=cpp_source, functions=["colsum"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.colsum(x)
