"""CUDA, WRONG (the cuda example with one line changed): leaky ReLU where ReLU is asked for the `relu` problem (KernelBench load_inline convention)."""
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
        y[i] = v > 0.f ? v : 0.01f * v;  // leaky: wrong
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

relu = load_inline(name="kf_cuda_relu_wrong", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["relu_cuda"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu.relu_cuda(x)
