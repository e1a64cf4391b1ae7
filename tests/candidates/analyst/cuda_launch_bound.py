"""CUDA: ten launches of a tiny affine kernel on 256 floats per forward (reference ref_affine_chain).

Right first advice: do more work per launch (fuse the ten steps into one kernel, or a CUDA graph).
Already there: coalesced, one element per thread.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void affine_kernel(const float* __restrict__ x, float* __restrict__ out, float s, float t, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * s + t;
}

torch::Tensor affine(torch::Tensor x, double scale, double shift) {
    auto out = torch::empty_like(x);
    const int n = x.numel();
    affine_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), (float)scale, (float)shift, n);
    return out;
}
"""

ext = load_inline(name="kforge_analyst_tiny_cuda", cpp_sources="torch::Tensor affine(torch::Tensor x, double scale, double shift);",
                  cuda_sources=cuda_source, functions=["affine"])


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        for step in range(10):
            x = ext.affine(x, 1.01, 0.001 * step)
        return x
