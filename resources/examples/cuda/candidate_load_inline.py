"""CUDA, correct: elementwise ReLU for the `relu` problem in the stock KernelBench `load_inline` convention.

KForge builds it faster than plain `load_inline`: the kernel goes to a `.cu` without torch's headers and
the wrapper to the C++ file, compiled against a precompiled `torch/extension.h` (measured on an H100:
12-23 s against 68 s plain), and a repeat comes from the build cache. `candidate.py` (NVRTC) takes well
under a second."""
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
        y[i] = v > 0.f ? v : 0.f;
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

relu = load_inline(name="kf_cuda_relu", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["relu_cuda"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu.relu_cuda(x)
