"""CUDA 9-tap weighted moving sum along rows whose read-only inputs are plain `const float*` (reference ref_stencil).

Each thread reads 9 neighbours of x and all 9 weights in its tap loop. x and w are only read, but neither
is `const float* __restrict__` nor loaded with `__ldg`, so nvcc must assume `out` may alias them and cannot
use the read-only (non-coherent) load path: nvcc 13 for sm_90 emits `ld.global.f32` for their loads, and
`ld.global.nc.f32` once both are declared `const float* __restrict__`.
Right first advice: mark the read-only inputs `const float* __restrict__` (or load them with `__ldg`).
Already there: coalesced loads (neighbouring threads read neighbouring x), one kernel for the whole forward.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void stencil_kernel(const float* x, const float* w, float* out, int cols, int taps) {
    const int row = blockIdx.y;
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    const int half = taps / 2;
    float acc = 0.f;
    for (int k = 0; k < taps; ++k) {
        const int c = col + k - half;
        // multiply, then add, each rounded: the reference's order, so the sums match it exactly (no FMA)
        if (c >= 0 && c < cols) acc = __fadd_rn(acc, __fmul_rn(w[k], x[(long)row * cols + c]));
    }
    out[(long)row * cols + col] = acc;
}

torch::Tensor stencil(torch::Tensor x, torch::Tensor w) {
    auto out = torch::empty_like(x);
    const int rows = x.size(0), cols = x.size(1), taps = w.numel();
    const dim3 grid((cols + 255) / 256, rows);
    stencil_kernel<<<grid, 256>>>(x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), cols, taps);
    return out;
}
"""

ext = load_inline(name="kforge_analyst_stencil", cpp_sources="torch::Tensor stencil(torch::Tensor x, torch::Tensor w);",
                  cuda_sources=cuda_source, functions=["stencil"])


class ModelNew(nn.Module):
    def forward(self, x, w):
        return ext.stencil(x.contiguous(), w.contiguous())
