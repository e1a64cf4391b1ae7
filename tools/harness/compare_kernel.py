"""The output compare of `compare._Pass` as one Triton kernel a chunk, for outputs on a GPU.

The torch pass is a chain of elementwise kernels over float64 copies of each chunk (17 a chunk where every value is
finite, 45 with the masks that NaN and Inf need), each reading and writing the chunk again; on level1/63's 8.6 GB
output a masked compare took 0.34 s (H200, 2026-12-03), five times in a verify and three in a profile. Here each block
of elements is loaded once in its own dtype, computed on in float64 in registers, with the masks (they cost nothing
in registers), and reduced to one row of partial results: about one read of the outputs.

Each row holds what `_Pass.add` stacks a chunk, in the same order and the same float64 arithmetic (`QUANTITIES`);
only the sums' order differs (per block, then over blocks, where torch.dot has its own), so the relative L2 errors
agree to rounding, and the counts and maxima exactly. The kernel is built and run for float32 outputs alone (`usable`);
where it cannot run (no Triton, a tensor not on a GPU, another dtype) the caller uses the torch passes. Imported only
where Triton is (`compare`): a CPU judge needs none of it.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["QUANTITIES", "chunk_quantities", "usable"]

# bad, max |diff|, max |diff|/|e|, NaN and Inf where the reference has none, and the square sums of the relative L2
# errors: [sum (g - truth)^2, sum truth^2] and, with a float64 truth, [sum (e - truth)^2, sum truth^2].
QUANTITIES = 9
_BLOCK = 1024


def _compare_block(e_ptr, g_ptr, t_ptr, params_ptr, out_ptr, n, truth_given, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    # Tolerances from a float64 tensor (Triton passes a Python float as float32). Whether there is a float64 truth is
    # a value, not a constexpr, so that one build serves both (each build costs a worker's readying ~1 s).
    atol, rtol, big_min = tl.load(params_ptr), tl.load(params_ptr + 1), tl.load(params_ptr + 2)
    e = tl.load(e_ptr + offs, mask=inside, other=0.0).to(tl.float64)
    g = tl.load(g_ptr + offs, mask=inside, other=0.0).to(tl.float64)
    diff = tl.abs(g - e)
    e_abs, g_abs = tl.abs(e), tl.abs(g)
    e_nan, g_nan = e != e, g != g
    e_inf, g_inf = e_abs == float("inf"), g_abs == float("inf")
    e_fin, g_fin = e_abs < float("inf"), g_abs < float("inf")  # (NaN compares false)
    fin = e_fin & g_fin
    # As `_Pass._bad`: same-signed infinities compare equal, and so do NaNs where the reference has one; an infinite
    # reference is matched by nothing else.
    ok = ((diff <= atol + rtol * e_abs) & e_fin) | (e_nan & g_nan) | (e_inf & (g == e))
    abs_err = tl.where(fin, diff, 0.0)
    big = fin & (e_abs > big_min)
    rel_err = tl.where(big, diff / tl.where(big, e_abs, 1.0), 0.0)
    # The candidate's error against the truth (the float64 run, or else the reference: (g - e)^2 is |g - e|^2), and
    # the reference's own against the float64 run (none without one).
    has_truth = offs < n * truth_given  # (elementwise: False everywhere without a truth)
    t = tl.load(t_ptr + offs, mask=has_truth, other=0.0).to(tl.float64)
    t_fin = tl.abs(t) < float("inf")
    truth = tl.where(has_truth, t, e)
    got_fin = tl.where(has_truth, t_fin, e_fin) & g_fin
    got_d, got_t = tl.where(got_fin, g - truth, 0.0), tl.where(got_fin, truth, 0.0)
    ref_fin = t_fin & e_fin & has_truth
    ref_d, ref_t = tl.where(ref_fin, e - t, 0.0), tl.where(ref_fin, t, 0.0)
    row = out_ptr + pid * 9
    tl.store(row, tl.sum(tl.where(ok, 0.0, 1.0), axis=0))  # masked-off elements are 0 == 0: never bad
    tl.store(row + 1, tl.max(abs_err, axis=0))
    tl.store(row + 2, tl.max(rel_err, axis=0))
    tl.store(row + 3, tl.sum(tl.where(g_nan & ~e_nan, 1.0, 0.0), axis=0))
    tl.store(row + 4, tl.sum(tl.where(g_inf & ~e_inf, 1.0, 0.0), axis=0))
    tl.store(row + 5, tl.sum(got_d * got_d, axis=0))
    tl.store(row + 6, tl.sum(got_t * got_t, axis=0))
    tl.store(row + 7, tl.sum(ref_d * ref_d, axis=0))
    tl.store(row + 8, tl.sum(ref_t * ref_t, axis=0))


# Jitted on import, in the fork server where the judge's workers come from: Triton reads a kernel's source file when
# it jits it, and a sandboxed worker may not see the path it was imported from. One build serves every chunk length.
# Under Triton's interpreter (TRITON_INTERPRET=1 before Triton is imported, as its own library needs: the tests, on a
# host without a GPU) it runs on CPU tensors.
_KERNEL = triton.jit(_compare_block, do_not_specialize=["n", "truth_given"])


def usable(expected: Any, got: Any, truth: Any, interpret: bool = False) -> bool:
    """Whether the kernel compares these flat tensors: float32 outputs (KernelBench's) and a float64 truth or none, on
    one GPU (on the CPU, under `interpret`). That is the one build a worker makes while it readies (1.1 s more of its
    readying, H200, 2026-12-03); another dtype would be built in the job (a judge's bfloat16 null cost 0.4 s so), where
    the torch passes compare it in milliseconds."""
    if expected.dtype != torch.float32 or got.dtype != torch.float32 or got.device != expected.device:
        return False
    if truth is not None and (truth.dtype != torch.float64 or truth.device != expected.device):
        return False
    return expected.device.type == ("cpu" if interpret else "cuda")


def chunk_quantities(e: Any, g: Any, t: Any, atol: float, rtol: float, big_min: float) -> Any:
    """`QUANTITIES` float64 values on the device for one flat chunk (contiguous, with int32 offsets) of the
    reference's output `e`, the candidate's `g` and the float64 truth `t` (or None), reduced over its blocks."""
    n = e.numel()
    blocks = max(1, -(-n // _BLOCK))
    rows = torch.empty((blocks, QUANTITIES), dtype=torch.float64, device=e.device)
    params = torch.tensor([atol, rtol, big_min], dtype=torch.float64).to(e.device, non_blocking=True)
    # atol + rtol*|e| rounded as torch rounds it (on CPU tensors, Triton's interpreter takes no such option)
    options = {} if e.device.type == "cpu" else {"enable_fp_fusion": False}
    # Without a truth its pointer is the float64 `params`, never read: the same build as with a float64 truth.
    _KERNEL[(blocks,)](e, g, t if t is not None else params, params, rows, n, int(t is not None), BLOCK=_BLOCK,
                       **options)
    return torch.cat([rows[:, :1].sum(0), rows[:, 1:3].amax(0), rows[:, 3:].sum(0)])
