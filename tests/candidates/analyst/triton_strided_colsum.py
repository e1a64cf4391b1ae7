"""Triton column sums with one program per column: its tl.arange walks down the rows, `n_cols` floats apart
(reference ref_colsum).

Each load's only tl.arange is multiplied by the row stride, so a warp's lanes read addresses a row apart:
one 32-byte sector per float, and no vector loads.
Right first advice: coalesce the loads (let each program own a block of columns, unmultiplied, and loop over rows).
Already there: one kernel for the whole forward, a float64 accumulator (fp32 sums of 2048 values in order miss
torch's by more than fp32 tolerances on columns near 0).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def colsum_kernel(x_ptr, out_ptr, n_rows, n_cols, BLOCK: tl.constexpr):
    col = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + rows * n_cols + col, mask=rows < n_rows, other=0.0).to(tl.float64)
    tl.store(out_ptr + col, tl.sum(acc, axis=0).to(tl.float32))


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty(x.shape[1], device=x.device, dtype=x.dtype)
        colsum_kernel[(x.shape[1],)](x, out, x.shape[0], x.shape[1], BLOCK=256)
        return out
