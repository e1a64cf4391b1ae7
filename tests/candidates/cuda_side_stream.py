"""CUDA, correct output but hides its work on a side stream and returns before it finishes."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void slow_relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i], acc = 0.f;
        for (int k = 0; k < 2000; ++k) acc = acc * 0.5f + v * 1e-30f;  // burn time; acc stays ~0
        y[i] = (v > 0.f ? v : 0.f) + (acc == 12345.f ? 1.f : 0.f);
    }
}

torch::Tensor relu_side(torch::Tensor x, int64_t stream_ptr) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    slow_relu_kernel<<<(n + 255) / 256, 256, 0, reinterpret_cast<cudaStream_t>(stream_ptr)>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
cpp_source = "torch::Tensor relu_side(torch::Tensor x, int64_t stream_ptr);"

ext = load_inline(name="kf_cuda_side", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["relu_side"])
_side = torch.cuda.Stream()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        _side.wait_stream(torch.cuda.current_stream())
        return ext.relu_side(x, _side.cuda_stream)
