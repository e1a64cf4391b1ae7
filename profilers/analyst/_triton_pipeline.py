"""Triton kernels compiled without software pipelining: num_stages=1 on a loop that feeds tl.dot from tl.load.

Triton's pipeliner keeps `num_stages` tiles of a loop's loads in flight in shared memory, so the next
iteration's loads overlap this iteration's tl.dot; with num_stages=1 every iteration waits for its own loads
(hundreds of cycles of DRAM/L2 latency) before the tensor cores start. The compiled kernel's metadata says
how many stages it got and how much shared memory it uses (one stage's tiles at num_stages=1; at most N
stages' at num_stages=N, fewer where Triton buffers fewer loads than stages), so the advice says how many stages fit the shared memory a block may use on that GPU.
Triton's own matmul tutorial configurations use 3-5 stages on Ampere and Hopper.
"""

from __future__ import annotations

import ast

from kforge.profilers.compiler_report import KernelResources

from ._findings import PRIORITY_CODE, Draft, Findings, pct
from ._hardware import Claim
from .base import Evidence
from .source import SourceFacts

__all__ = ["unpipelined_loops"]

GAIN_PIPELINING = 0.35
# Shared memory one block may use (opt-in maximum, bytes), by compute capability (CUDA programming guide).
_SMEM_PER_BLOCK = {"sm_70": 98304, "sm_72": 98304, "sm_75": 65536, "sm_80": 166912, "sm_86": 101376, "sm_87": 166912,
                   "sm_89": 101376, "sm_90": 232448, "sm_100": 232448, "sm_103": 232448, "sm_120": 101376}
# What Triton's tutorials pick: more stages hide more latency until shared memory runs out.
_WANTED_STAGES = 3


def _dot_loop(code: str, kernel: str) -> int | None:
    """Line of the first `for` loop in `kernel` whose body both loads (tl.load) and multiplies (tl.dot)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == kernel):
        for loop in (n for n in ast.walk(fn) if isinstance(n, (ast.For, ast.While))):
            calls = {c.func.attr for c in ast.walk(loop) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)}
            if {"load", "dot"} <= calls:
                return loop.lineno
    return None


def _stages_line(code: str) -> int | None:
    """The line of a call that asks for one stage (`kernel[grid](..., num_stages=1)`, `triton.Config(...,
    num_stages=1)`): read with `ast`, so a docstring or comment saying it does not count."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        for kw in call.keywords:
            if kw.arg == "num_stages" and isinstance(kw.value, ast.Constant) and kw.value.value == 1:
                return kw.value.lineno
    return None


def unpipelined_loops(k: KernelResources, facts: SourceFacts, out: Findings, share: float) -> None:
    """A draft for a Triton kernel (its metadata has num_warps) compiled with num_stages=1 around a tl.dot loop.

    Its action avoids the words for what such a kernel has (tiles, tl.dot): `redundant.prune` would read them as
    advice to add them and cut the sentence."""
    if k.num_warps is None or k.num_stages != 1:
        return
    code = "\n".join(facts.lines)
    loop_line = _dot_loop(code, k.kernel)
    if loop_line is None:
        return
    limit = _SMEM_PER_BLOCK.get(k.arch or "")
    stage = k.shared_bytes or 0  # at num_stages=1 the kernel's shared memory is one stage's tiles
    fit = limit // stage if limit and stage else None
    stages = min(_WANTED_STAGES, fit) if fit else _WANTED_STAGES
    ev = [Evidence(metric="num_stages", value=1.0, judged_against=f"{_WANTED_STAGES} or more (loads of the next "
                   "iterations in flight)", source="triton metadata"),
          Evidence(metric="num_warps", value=float(k.num_warps), judged_against=None, source="triton metadata")]
    if stage:
        ev.append(Evidence(metric="shared memory per block [B]", value=float(stage),
                           judged_against=f"{limit} on {k.arch} (the most a block may use)" if limit else None,
                           source="triton metadata"))
    if fit is not None and fit < 2:
        action = (f"Make BLOCK_K (or BLOCK_M, BLOCK_N) smaller first: one stage already takes {stage // 1024} KiB of "
                  f"the {limit // 1024} KiB a block may use on {k.arch}; then compile with num_stages=2 or more so the "
                  "next iteration's loads overlap this iteration's matrix product.")
    else:
        need = f" (at most {stages} x {stage // 1024} KiB = {stages * stage // 1024} KiB of shared memory, of the " \
               f"{limit // 1024} KiB a block may use on {k.arch})" if stage and limit else ""
        action = (f"Compile the kernel with num_stages={stages}{need} (at the launch, `kernel[grid](..., "
                  f"num_stages={stages})`, or in its triton.Config), so Triton's pipeliner loads the next iterations' "
                  "blocks into shared memory while this iteration's matrix product runs; keep the loop a plain `for k "
                  "in range(0, K, BLOCK_K)` so it can be pipelined.")
    where = _stages_line(code) or loop_line
    why = (f"{k.kernel} was compiled with num_stages=1: its loop at line {loop_line} loads its tiles and then waits for "
           "them before every tl.dot, so the tensor cores idle for a memory latency per iteration")
    out.drafts.append(Draft(f"Pipeline the loads of {k.kernel}'s loop", action, f"line {where}", why,
                            f"most of {pct(share)} of the time: unpipelined matmul loops run well below pipelined ones",
                            "medium", ev, share, gain=share * GAIN_PIPELINING, located=True))
    out.claims.append(Claim("latency-bound", PRIORITY_CODE, why, ev, "medium"))
