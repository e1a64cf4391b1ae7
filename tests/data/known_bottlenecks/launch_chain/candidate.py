"""Known bottleneck: launch overhead. 24 launches of a tiny kernel on 4096 elements; each launch does
nanoseconds of work and pays microseconds of launch and dispatch."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void step(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(__fmul_rn(x[i], 0.5f), 0.25f);
}

torch::Tensor step_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat);
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int n = xc.numel();
    step<<<(n + 255) / 256, 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
cpp_source = "torch::Tensor step_cuda(torch::Tensor x);"

ext = load_inline(name="kf_kb_step_chain", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["step_cuda"])


class ModelNew(nn.Module):
    def forward(self, x):
        for _ in range(24):
            x = ext.step_cuda(x)
        return x
