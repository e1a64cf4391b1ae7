"""Known bottleneck: DRAM bandwidth. A coalesced, float4-vectorized axpy; nothing left to gain but bytes."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void axpy_vec4(const float4* __restrict__ x, const float4* __restrict__ y, float4* __restrict__ out,
                          long n4) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        float4 a = x[i], b = y[i];
        out[i] = make_float4(2.f * a.x + b.x, 2.f * a.y + b.y, 2.f * a.z + b.z, 2.f * a.w + b.w);
    }
}

__global__ void axpy_tail(const float* x, const float* y, float* out, long start, long n) {
    long i = start + (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.f * x[i] + y[i];
}

torch::Tensor axpy_cuda(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda() && x.scalar_type() == torch::kFloat && x.sizes() == y.sizes());
    auto xc = x.contiguous(), yc = y.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel(), n4 = n / 4;
    int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    if (n4 > 0)
        axpy_vec4<<<sms * 8, 256>>>(reinterpret_cast<const float4*>(xc.data_ptr<float>()),
                                    reinterpret_cast<const float4*>(yc.data_ptr<float>()),
                                    reinterpret_cast<float4*>(out.data_ptr<float>()), n4);
    if (n - 4 * n4 > 0)
        axpy_tail<<<1, 4>>>(xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(), 4 * n4, n);
    return out;
}
"""
cpp_source = "torch::Tensor axpy_cuda(torch::Tensor x, torch::Tensor y);"

ext = load_inline(name="kf_kb_axpy_vec4", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["axpy_cuda"])


class ModelNew(nn.Module):
    def forward(self, x, y):
        return ext.axpy_cuda(x, y)
