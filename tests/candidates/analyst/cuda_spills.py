"""CUDA elementwise recurrence holding 48 values per thread under a register cap: ptxas spills.

`__launch_bounds__(1024, 2)` caps the kernel at 32 registers per thread, and 48 live accumulators do not
fit, so ptxas spills them to local memory. Loads and stores are coalesced (one element per thread).
Right first advice: stop the register spills (do not cap registers below what the kernel needs, or hold less).
Already there: coalesced accesses, one fused kernel.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

constexpr int K = 48;

__global__ void __launch_bounds__(1024, 2) mix_kernel(const float* __restrict__ x, float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    float h[K];
    #pragma unroll
    for (int k = 0; k < K; ++k) h[k] = v * (0.02f * (k + 1));
    #pragma unroll
    for (int r = 0; r < 4; ++r) {
        const float first = h[0];
        #pragma unroll
        for (int k = 0; k < K - 1; ++k) h[k] = 0.5f * h[k] + 0.25f * h[k + 1] + v;
        h[K - 1] = 0.5f * h[K - 1] + 0.25f * first + v;
    }
    float s = 0.f;
    #pragma unroll
    for (int k = 0; k < K; ++k) s += h[k];  // one sign: an alternating sum cancels to ~1e-5 of its terms, past fp32 checks
    out[i] = s;
}

torch::Tensor mix(torch::Tensor x) {
    auto out = torch::empty_like(x);
    const int n = x.numel();
    mix_kernel<<<(n + 1023) / 1024, 1024>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

ext = load_inline(name="kforge_analyst_spills", cpp_sources="torch::Tensor mix(torch::Tensor x);",
                  cuda_sources=cuda_source, functions=["mix"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.mix(x.contiguous())
