"""B5 persisting L2 (problem relu, CUDA): reserves a persisting-L2 carve-out and marks its input as
persisting, so the harness's cache flush cannot evict it. Must be rejected (static scan) and the L2 flush
resets persisting lines anyway."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <algorithm>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu_persist(torch::Tensor x) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, dev);
    cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, prop.persistingL2CacheMaxSize);
    cudaStreamAttrValue attr = {};
    attr.accessPolicyWindow.base_ptr = x.data_ptr();
    attr.accessPolicyWindow.num_bytes = std::min<size_t>(x.numel() * sizeof(float), prop.accessPolicyMaxWindowSize);
    attr.accessPolicyWindow.hitRatio = 1.0f;
    attr.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    attr.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    auto stream = at::cuda::getCurrentCUDAStream();
    cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &attr);
    auto out = torch::empty_like(x);
    int n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
cpp_source = "torch::Tensor relu_persist(torch::Tensor x);"

ext = load_inline(name="adv_cuda_l2_persist", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["relu_persist"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_persist(x.contiguous())
