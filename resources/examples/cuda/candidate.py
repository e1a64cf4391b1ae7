"""CUDA, correct: elementwise ReLU for the `relu` problem, built with NVRTC in well under a second.

The kernel is a raw `extern "C" __global__` function compiled at import by `torch.cuda._compile_kernel`
(NVRTC: no host compiler, no torch headers) and launched from `forward` with explicit grid and block.
Arguments: tensors become device pointers; a Python int becomes a 32-bit `int`, a Python float a
`double` (declare `double` parameters, or pass a one-element tensor). Outputs are allocated in Python.
The stock KernelBench form (`load_inline` with a C++ launcher) works too, at tens of seconds per new
build: see `candidate_load_inline.py` beside this file.
"""
import torch
import torch.nn as nn

kernel_source = r"""
extern "C" __global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v > 0.f ? v : 0.f;
    }
}
"""

relu_kernel = torch.cuda._compile_kernel(kernel_source, "relu_kernel")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        threads = 256
        relu_kernel(grid=((n + threads - 1) // threads, 1, 1), block=(threads, 1, 1), args=[x, out, n])
        return out
