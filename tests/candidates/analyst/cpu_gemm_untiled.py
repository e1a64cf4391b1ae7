"""Naive dot-product GEMM (i-j-k), parallel over rows, no tiling (problem pack 'matmul').

Right first advice: tile (block) the loops and order them i-k-j so the inner loop is unit-stride.
Already there: `#pragma omp parallel for` (must not be advised again).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous(), bc = b.contiguous();
    const int64_t n = ac.size(0), k_dim = ac.size(1), m = bc.size(1);
    auto out = torch::empty({n, m}, ac.options());
    const float* A = ac.data_ptr<float>();
    const float* B = bc.data_ptr<float>();
    float* C = out.data_ptr<float>();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < m; ++j) {
            float acc = 0.f;
            for (int64_t k = 0; k < k_dim; ++k) {
                acc += A[i * k_dim + k] * B[k * m + j];
            }
            C[i * m + j] = acc;
        }
    }
    return out;
}
"""

ext = load_inline(name="kforge_analyst_gemm", cpp_sources=cpp_source, functions=["matmul"])


class ModelNew(nn.Module):
    def forward(self, a, b):
        return ext.matmul(a, b)
