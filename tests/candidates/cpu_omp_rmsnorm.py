"""RMSNorm (problem rmsnorm) as one OpenMP C++ loop over (batch, spatial) blocks: KernelBench format, load_inline."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor rmsnorm_fwd(torch::Tensor x, double eps) {
    TORCH_CHECK(x.dim() >= 2 && x.scalar_type() == torch::kFloat, "x must be float32 with a feature dim");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t batch = xc.size(0), features = xc.size(1);
    const int64_t inner = xc.numel() / (batch * features);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float feps = static_cast<float>(eps);
    // One task per (batch, block of 64 spatial positions): rows of the feature dim are strided.
    const int64_t block = 64;
    const int64_t blocks = (inner + block - 1) / block;
    #pragma omp parallel for
    for (int64_t t = 0; t < batch * blocks; ++t) {
        const int64_t b = t / blocks;
        const int64_t s0 = (t % blocks) * block;
        const int64_t s1 = s0 + block < inner ? s0 + block : inner;
        const float* base = in + b * features * inner;
        float* obase = o + b * features * inner;
        float acc[64] = {0.f};
        for (int64_t f = 0; f < features; ++f) {
            const float* row = base + f * inner;
            #pragma omp simd
            for (int64_t s = s0; s < s1; ++s) acc[s - s0] += row[s] * row[s];
        }
        float inv[64];
        for (int64_t s = s0; s < s1; ++s) inv[s - s0] = 1.f / std::sqrt(acc[s - s0] / features + feps);
        for (int64_t f = 0; f < features; ++f) {
            const float* row = base + f * inner;
            float* orow = obase + f * inner;
            #pragma omp simd
            for (int64_t s = s0; s < s1; ++s) orow[s] = row[s] * inv[s - s0];
        }
    }
    return out;
}
"""

rmsnorm = load_inline(
    name="kforge_bench_rmsnorm",
    cpp_sources=cpp_source,
    functions=["rmsnorm_fwd"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x):
        return rmsnorm.rmsnorm_fwd(x, self.eps)
