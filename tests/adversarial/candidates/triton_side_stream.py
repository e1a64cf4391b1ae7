"""B1 side stream, Triton style (problem relu): launches on a side stream and returns without joining it."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def slow_relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    acc = tl.zeros_like(x)
    # Burn ~0.7 ms (acc stays ~0): well beyond the host's own launch path. Triton's Python launch took ~60 us on a
    # busy 4-lane host (s25), long enough to cover a 70 us side kernel between the timer's events, so that work
    # was seen by the device timer; the wall-clock anchor and the timed outputs failed it instead.
    for _ in range(20000):
        acc = acc * 0.5 + x * 1e-30
    tl.store(y_ptr + offs, tl.maximum(x, 0.0) + tl.where(acc == 12345.0, 1.0, 0.0), mask=mask)


_side = torch.cuda.Stream() if torch.cuda.is_available() else None


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(_side):
            slow_relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
