"""CUDA, correct: row softmax (`softmax` problem) in the KernelBench form, with what real candidates use.

A `__device__` warp reduction, dynamic shared memory, the current stream from ATen, macros, a constant,
a struct, a kernel declared before the wrapper and defined after it. KForge splits the kernels from
the wrappers (tests/test_cuda_split.py compiles both halves; the GPU tests verify the result)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>

#define CHECK_INPUT(x) TORCH_CHECK((x).is_cuda() && (x).is_contiguous(), #x " must be a contiguous CUDA tensor")
constexpr int kThreads = 256;
struct RowShape { int rows; int cols; };

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__global__ void __launch_bounds__(kThreads) softmax_rows(const float* __restrict__ x, float* __restrict__ y,
                                                         RowShape shape);

torch::Tensor softmax_cuda(torch::Tensor x) {
    CHECK_INPUT(x);
    auto y = torch::empty_like(x);
    RowShape shape{static_cast<int>(x.size(0)), static_cast<int>(x.size(1))};
    const int warps = kThreads / 32;
    softmax_rows<<<shape.rows, kThreads, 2 * warps * sizeof(float),
                   at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), shape);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}

__global__ void __launch_bounds__(kThreads) softmax_rows(const float* __restrict__ x, float* __restrict__ y,
                                                         RowShape shape) {
    extern __shared__ float scratch[];  // per warp: max, then sum
    const float* row = x + (size_t)blockIdx.x * shape.cols;
    float* out = y + (size_t)blockIdx.x * shape.cols;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < shape.cols; c += blockDim.x) m = fmaxf(m, row[c]);
    m = warp_max(m);
    if (lane == 0) scratch[warp] = m;
    __syncthreads();
    m = -INFINITY;
    for (int w = 0; w < warps; ++w) m = fmaxf(m, scratch[w]);
    float s = 0.f;
    for (int c = threadIdx.x; c < shape.cols; c += blockDim.x) s += __expf(row[c] - m);
    s = warp_sum(s);
    if (lane == 0) scratch[warps + warp] = s;
    __syncthreads();
    s = 0.f;
    for (int w = 0; w < warps; ++w) s += scratch[warps + w];
    for (int c = threadIdx.x; c < shape.cols; c += blockDim.x) out[c] = __expf(row[c] - m) / s;
}
"""
cpp_source = "torch::Tensor softmax_cuda(torch::Tensor x);"

ext = load_inline(name="kf_kb_softmax", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["softmax_cuda"],
                  extra_cuda_cflags=["-O3", "--use_fast_math"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.softmax_cuda(x.contiguous())
