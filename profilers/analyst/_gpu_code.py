"""Rules over GPU kernels' code: uncoalesced loads (CUDA and Triton), uncached read-only inputs, register spills.

Expected gains only order the advice (see code_rules.py): an uncoalesced load moves up to 8-32x the
bytes it uses; a spill adds local-memory traffic to every thread; a read-only input loaded without
`const __restrict__` / `__ldg` costs less: since Volta the read-only path shares L1 with ordinary loads,
so the gain is the non-coherent load and the reloads the compiler drops once it knows the input cannot
alias the output, a few percent up to ~20% where values are re-read (stencils, broadcast weights).
"""

from __future__ import annotations

import re

from kforge.profilers.compiler_report import CompilerFacts, KernelResources
from kforge.profilers.report import ProfileReport

from ._compare import locate_definition
from ._findings import PRIORITY_CODE, Draft, Findings, own_share, pct, roofline_evidence
from ._hardware import Claim, uncoalesced
from ._remedies import REMEDIES
from ._stride import factors, stride_kind
from ._triton_pipeline import unpipelined_loops
from .base import Evidence
from .source import GpuKernel, SourceFacts

__all__ = ["gpu_findings"]

GAIN_UNCOALESCED = 0.7
GAIN_SPILLS = 0.4
GAIN_READ_ONLY = 0.1

_SUBSCRIPT = re.compile(r"(?P<name>[A-Za-z_]\w*)\s*\[(?P<index>[^\[\]]+)\]")
COALESCE_TITLE = "Coalesce the global loads"
_TRITON_COALESCE = (
    "Give the load a unit-stride axis: let a `tl.arange` run along the tensor's contiguous dimension and be added "
    "without a factor, and move the strided index to the other axis or to the loop. For a column walk, let each "
    "program own BLOCK columns (`cols = pid * BLOCK + tl.arange(0, BLOCK)`) and loop over rows (`x_ptr + r * n_cols "
    "+ cols`); where the values are needed in the other order, load a 2-D block whose contiguous axis is unmultiplied "
    "(`x_ptr + rows[None, :] * n_cols + cols[:, None]`): Triton makes that axis the fastest, and `tl.trans` or a "
    "reduction over the other axis gives the order you need. Strided loads that together cover a contiguous range "
    "(interleaved pairs) are one contiguous load split with `tl.reshape` and `tl.split`.")


def _coalesce(report: ProfileReport | None, out: Findings, share: float, line: int, ev: list[Evidence], why: str,
              action: str) -> None:
    """The draft and claim of an uncoalesced load, CUDA or Triton alike; counters raise the confidence."""
    hottest = max(report.ncu, key=lambda k: k.metrics.get("Duration [us]", 0.0)) if report and report.ncu else None
    ncu_ev = uncoalesced(hottest)
    ev = roofline_evidence(report) + ncu_ev + ev
    out.drafts.append(Draft(
        COALESCE_TITLE, action, f"line {line}", why, f"most of {pct(share)} of the time: uncoalesced loads move up to "
        "8-32x the bytes", "high" if ncu_ev else "medium", ev, share, gain=share * GAIN_UNCOALESCED, located=True))
    out.claims.append(Claim("memory-bound", PRIORITY_CODE - (1 if ncu_ev else 0), why, ev, "high" if ncu_ev else "medium",
                            "memory-bound:uncoalesced"))


def _strided_access(kernel: GpuKernel, facts: SourceFacts) -> tuple[int, str, str] | None:
    """(line, 'x[row * cols + j]', 'cols'): the first subscript whose thread-fast index is multiplied by more than 1."""
    for n in range(kernel.line, kernel.last + 1):
        for m in _SUBSCRIPT.finditer(facts.lines[n - 1].split("//")[0]):
            for var in kernel.fast_vars:
                strided = [f for f in factors(var, m.group("index")) if stride_kind(f, facts.constants) == "strided"]
                if strided:
                    return n, m.group(0), strided[0]
    return None


def _uncoalesced_cuda(report: ProfileReport | None, facts: SourceFacts, out: Findings, share: float) -> bool:
    for kernel in facts.gpu_kernels:
        if (hit := _strided_access(kernel, facts)) is None:
            continue
        line, access, factor = hit
        why = (f"{access} at line {line} multiplies the thread's index ({', '.join(kernel.fast_vars)}) by {factor}: "
               "neighbouring threads of a warp touch addresses a row apart, so each load takes its own 32-byte sector")
        ev = [Evidence(metric="global index", value=access,
                       judged_against="threadIdx.x-derived index added without a stride", source="source")]
        _coalesce(report, out, share, line, ev, why, REMEDIES["gpu"]["memory-bound:uncoalesced"])
        return True
    return False


def _uncoalesced_triton(report: ProfileReport | None, facts: SourceFacts, out: Findings, share: float) -> None:
    if not facts.triton_strided_loads:
        return
    load = facts.triton_strided_loads[0]
    what = (f"its tl.arange by {load.factor}" if load.rank == 1 else
            f"the tl.arange of every axis of its {load.rank}-D block, the fastest by {load.factor}")
    why = (f"the load at line {load.line} in {load.kernel} ({load.pointer}) multiplies {what}: neighbouring lanes of a "
           f"warp read addresses {load.factor} elements apart, so each element takes its own 32-byte sector and the load "
           "cannot be vectorized")
    ev = [Evidence(metric="load offset", value=load.pointer, judged_against="a tl.arange added without a factor "
                   "(a unit-stride axis, which Triton makes the fastest)", source="source")]
    _coalesce(report, out, share, load.line, ev, why, _TRITON_COALESCE)


def _uncached(facts: SourceFacts, out: Findings, share: float) -> None:
    """Read-only inputs re-read without `const __restrict__` or `__ldg`: a hint, ranked by its small gain."""
    if not facts.uncached_inputs:
        return
    kernel = facts.uncached_inputs[0].kernel
    found = [u for u in facts.uncached_inputs if u.kernel == kernel]
    first = found[0].param
    looped = next((u for u in found if u.loop_line is not None), None)
    names = ", ".join(u.param.name for u in found)
    how = (f"inside the loop at line {looped.loop_line}" if looped else
           f"{found[0].count} times (line {', '.join(map(str, found[0].reads))})")
    why = (f"{names} in {kernel} {'is' if len(found) == 1 else 'are'} only read, {how}, but declared "
           f"{', '.join(f'`{u.param.decl}`' for u in found)}, with no `__ldg`: without `const ... __restrict__` nvcc must "
           "assume the output may alias them, so their loads skip the read-only (non-coherent) path and are repeated "
           "after stores")
    others = [u for u in facts.uncached_inputs if u.kernel != kernel]
    action = (f"Declare {', '.join(f'`{u.param.suggested}`' for u in found)} in {kernel}'s parameter list (line "
              f"{first.line}), or load them with `__ldg(&{first.name}[i])`: the compiler then knows nothing writes them "
              "during the kernel, loads them through the read-only cache path and keeps loaded values in registers "
              "across stores to the output."
              + (f" The same holds for {', '.join(f'{u.param.name} in {u.kernel}' for u in others)}." if others else ""))
    ev = [Evidence(metric="read-only inputs without const __restrict__",
                   value=", ".join(f"{u.param.name} (line {u.param.line})" for u in facts.uncached_inputs),
                   judged_against="`const T* __restrict__` parameters or `__ldg` loads", source="source"),
          Evidence(metric=f"loads of {found[0].param.name}", value=", ".join(f"line {n}" for n in found[0].reads),
                   judged_against="read once, outside loops", source="source")]
    out.drafts.append(Draft(
        "Load the read-only inputs through the read-only cache", action, f"line {first.line}", why,
        "a few % up to ~20% of the kernel's time where values are re-read; little where each is read once",
        "medium" if looped else "low", ev, share, gain=share * GAIN_READ_ONLY, located=True, hint=True))


def _spills(k: KernelResources, facts: SourceFacts, out: Findings, share: float) -> None:
    spilled = k.spill_store_bytes or 0
    local = k.local_bytes or k.stack_bytes or 0
    if spilled <= 0 and local <= 0:
        return
    triton = k.num_warps is not None
    line = locate_definition(k.kernel, "\n".join(facts.lines))
    arrays = [a for a in facts.local_arrays if line is None or a[0] >= line]
    what = (f"{spilled} bytes of spill stores ({k.spill_load_bytes or 0} of loads) per thread at {k.registers} registers"
            if spilled else f"{local} bytes of local memory per thread at {k.registers} registers")
    ev = [Evidence(metric="spill stores [B]" if spilled else "local memory [B]", value=float(spilled or local),
                   judged_against="0 (everything in registers)", source="ptxas" if not triton else "triton metadata")]
    if k.registers is not None:
        ev.append(Evidence(metric="registers per thread", value=float(k.registers), judged_against="255 max", source=ev[0].source))
    if triton:
        action = (f"Give each program less to hold: a smaller BLOCK size (or a loop over chunks of it) or more warps "
                  f"(num_warps={k.num_warps} now: more warps spread the block over more registers), so the tile fits in "
                  "registers; check `n_spills` of the compiled kernel after the change.")
    else:
        action = ("Keep per-thread arrays small and indexed by compile-time constants (fully unrolled loops) so they live "
                  "in registers, move large per-thread buffers to shared memory, split a thread's work over more threads, "
                  "and do not cap registers (`__launch_bounds__` min-blocks, -maxrregcount) below what the kernel needs.")
    where = f"line {arrays[0][0]}" if arrays else (f"line {line}" if line else k.kernel)
    why = f"{k.kernel} spills: {what}; spilled values go through local memory (L1/L2/DRAM) on every use"
    out.drafts.append(Draft(f"Stop the register spills in {k.kernel.split('(')[0]}", action, where, why,
                            "spill traffic removed from every thread's inner loop", "high", ev, share,
                            gain=share * GAIN_SPILLS, located=True))
    out.claims.append(Claim("memory-bound", PRIORITY_CODE + 1, why, ev, "medium"))


def gpu_findings(report: ProfileReport | None, facts: SourceFacts, compiler: CompilerFacts | None, out: Findings) -> None:
    """Add the GPU kernels' findings to `out`: one coalescing draft (CUDA first, else Triton), read-only inputs,
    spills, and Triton loops compiled without pipelining."""
    share = own_share(report)
    if not _uncoalesced_cuda(report, facts, out, share):
        _uncoalesced_triton(report, facts, out, share)
    _uncached(facts, out, share)
    for k in compiler.kernels if compiler else []:
        _spills(k, facts, out, share)
        unpipelined_loops(k, facts, out, share)
