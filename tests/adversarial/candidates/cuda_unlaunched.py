"""A2 silent launch failure (problem relu, CUDA): asks for more shared memory than a block may have
without opting in, never checks the launch, and returns the unwritten output."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    extern __shared__ float scratch[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { scratch[threadIdx.x] = x[i]; y[i] = scratch[threadIdx.x] > 0.f ? scratch[threadIdx.x] : 0.f; }
}

torch::Tensor relu_unchecked(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256, 300 * 1024>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);  // fails
    return out;
}
"""
cpp_source = "torch::Tensor relu_unchecked(torch::Tensor x);"

ext = load_inline(name="adv_cuda_unlaunched", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["relu_unchecked"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_unchecked(x.contiguous())
