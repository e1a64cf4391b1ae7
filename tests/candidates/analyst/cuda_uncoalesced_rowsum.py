"""CUDA row sums with one thread per row: each thread walks its row, so a warp's loads are a row apart.

Right first advice: coalesce the loads (consecutive threads to consecutive addresses: a block per row
with a strided loop over columns and a reduction, or stage tiles through shared memory).
Already there: nothing to add that it has (no shared memory, no tiling, one kernel).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void rowsum_kernel(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    double acc = 0.0;  // a float sum of 4096 values in order misses torch's by >1e-4 (fp32 atol) on rows near 0
    for (int j = 0; j < cols; ++j) {
        acc += x[row * cols + j];
    }
    out[row] = (float)acc;
}

torch::Tensor rowsum(torch::Tensor x) {
    auto out = torch::empty({x.size(0)}, x.options());
    const int rows = x.size(0), cols = x.size(1);
    rowsum_kernel<<<(rows + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
    return out;
}
"""

ext = load_inline(name="kforge_analyst_rowsum", cpp_sources="torch::Tensor rowsum(torch::Tensor x);",
                  cuda_sources=cuda_source, functions=["rowsum"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.rowsum(x.contiguous())
