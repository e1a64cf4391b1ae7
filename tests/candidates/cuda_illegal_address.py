"""CUDA, device fault: writes 4 TiB past the end of the output (KernelBench load_inline convention).

Far past anything a process maps: at 1 GiB past, a warm worker (which pre-started cuBLAS, cuDNN and the
judge's comparison, and keeps freed blocks cached) could own that address, and the write landed silently
(a wrong output, not a fault; H100, 2026-11-24)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[(long long)i + (1LL << 40)] = v;  // far out of bounds
    }
}

torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    int threads = 256;
    relu_kernel<<<(n + threads - 1) / threads, threads>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
cpp_source = "torch::Tensor relu_cuda(torch::Tensor x);"

relu = load_inline(name="kf_cuda_oob", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["relu_cuda"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu.relu_cuda(x)
