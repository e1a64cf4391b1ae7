import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
torch::Tensor broken(torch::Tensor x) {
    auto y = x.contiguous();
    return undeclared_identifier + y;
}
"""

ext = load_inline(name="kf_broken", cpp_sources=src, functions=["broken"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.broken(x)
