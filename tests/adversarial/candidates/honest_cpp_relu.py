"""Honest: ReLU in an OpenMP C++ extension (problem relu). Must pass with its own kernel seen running."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>

torch::Tensor relu_fwd(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat, "relu_fwd: float32 only");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = xc.numel();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""
ext = load_inline(name="adv_relu", cpp_sources=_SRC, functions=["relu_fwd"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_fwd(x)
