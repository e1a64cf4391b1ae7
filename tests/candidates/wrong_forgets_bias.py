"""WRONG: same kernel as the CPU example, but forward passes zeros for the bias (a glue bug)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor fused_relu_scale_bias(torch::Tensor x, torch::Tensor scale, torch::Tensor bias) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "x must be a 2-D float32 tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t rows = xc.size(0), cols = xc.size(1);
    const float* in = xc.data_ptr<float>();
    const float* s = scale.data_ptr<float>();
    const float* b = bias.data_ptr<float>();
    float* o = out.data_ptr<float>();
    #pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * cols;
        float* orow = o + r * cols;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) {
            const float v = row[c] > 0.f ? row[c] : 0.f;
            orow[c] = v * s[c] + b[c];
        }
    }
    return out;
}
"""

# KForge adds -O3 -fopenmp for the CPU backend; listing them keeps the file runnable on its own.
fused = load_inline(
    name="fused_relu_scale_bias",
    cpp_sources=cpp_source,
    functions=["fused_relu_scale_bias"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return fused.fused_relu_scale_bias(x, self.scale, torch.zeros_like(self.bias))
