"""Rules over the candidate's code: source shapes and the compiler's report, weighed by the measurements.

Each finding is a located draft (a line of the candidate) with the share of time it is expected to
save, and may claim the bottleneck class the code explains. Expected gains are rough, stated as
module constants, and only order the advice: a serial loop on N cores can save 1 - 1/N of its time;
an untiled matmul typically 10x (the issue's naive GEMM went 107 ms -> 6.7 ms); a strided walk uses one
float of each 64-byte cache line; a scalar libm exp is several times slower than a vector one.
"""

from __future__ import annotations

import os
import re

from kforge.profilers.compiler_report import CompilerFacts
from kforge.profilers.report import ProfileReport

from ._findings import PRIORITY_CODE, Draft, Findings, memory_claim, own_share, pct, roofline_evidence
from ._gpu_code import gpu_findings
from ._hardware import Claim
from ._passes import pass_groups
from ._unvectorized import inner_loop_evidence, loop_verdicts, unvectorized_loops, verdict_evidence
from .base import Evidence
from .source import SourceFacts

__all__ = ["PRIORITY_CODE", "advised_against", "code_findings"]

# Below this much time per call of the candidate's own code, a parallel region costs about what it saves.
PARALLEL_MIN_US = 50.0
GAIN_GEMM_TILING = 0.85
GAIN_STRIDED = 0.75
GAIN_SCALAR_MATH = 0.6
GAIN_ATOMICS = 0.5
GAIN_WIDER_VECTORS = 0.25
GAIN_ONE_PASS = 0.2
# Passes over a whole tensor each stream it from DRAM: merging k of them saves up to (1 - 1/k) of the bytes.
GAIN_STREAM_PASSES = 0.8

_PRODUCT = re.compile(r"\+=\s*.*\w\s*\[[^\]]+\]\s*\*\s*\w+\s*\[[^\]]+\]")
# Flags as the candidate passes them (a quoted list item), not words in its docstring.
_ARCH_FLAG = re.compile(r"[\"']-(march|mcpu|mavx)")
_FAST_MATH = re.compile(r"[\"']-(ffast-math|Ofast|fno-math-errno)")
_SCALAR_SYMBOL = {"exp": ("exp", "expf"), "expf": ("expf",), "log": ("log", "logf"), "logf": ("logf",),
                  "tanh": ("tanh", "tanhf"), "tanhf": ("tanhf",), "pow": ("pow", "powf"), "powf": ("powf",)}
# The functions source.py finds, without the float suffix: `erf` is a base, `erff` its float form.
_MATH_BASES = {"exp", "exp2", "expm1", "log", "log2", "log1p", "pow", "tanh", "erf", "sin", "cos"}
# A libmvec variant: _ZGV<isa><mask><lanes><params>_<function>, e.g. _ZGVdN8v_expf, _ZGVbN4vv_powf.
_VECTOR_SYMBOL = re.compile(r"_ZGV[a-zA-Z]+\d+[a-z]*_(\w+?)(?:@.*)?$")


def _own_us_per_call(report: ProfileReport | None) -> float | None:
    """Median wall time of one forward call: the time a parallel region would split (None: not timed)."""
    if report is None or report.candidate is None:
        return None
    return report.candidate.median_us


def _cores(report: ProfileReport | None) -> int:
    if report is not None and report.candidate is not None and report.candidate.threads:
        return report.candidate.threads
    if report is not None and report.device is not None and report.device.cores:
        return report.device.cores
    return os.cpu_count() or 1


def _gemm_nests(facts: SourceFacts) -> list[tuple[int, list[int]]]:
    """(innermost loop, its chain) for loop nests of depth >= 3 that accumulate a product of two arrays."""
    found = []
    for i in facts.innermost():
        chain = facts.chain(i)
        loop = facts.loops[i]
        body = "\n".join(facts.lines[loop.line - 1:loop.last])
        if len(chain) >= 3 and _PRODUCT.search(body):
            found.append((i, chain))
    return found


def _cpu_rules(report: ProfileReport | None, facts: SourceFacts, compiler: CompilerFacts | None, out: Findings) -> None:
    share = own_share(report)
    roof = roofline_evidence(report)
    code = "\n".join(facts.lines)
    out.evidence.extend(inner_loop_evidence(facts, compiler))
    gemm_loops: set[int] = set()
    for inner, chain in _gemm_nests(facts):
        gemm_loops.update(chain)
        if any(facts.loops[j].step for j in chain):
            continue  # already tiled (a loop steps by a tile); the order advice below still applies
        outer = facts.loops[chain[0]]
        strided = facts.strided_subscripts(inner)
        why = (f"the loops at lines {', '.join(str(facts.loops[j].line) for j in chain)} compute a matmul element by "
               "element with no tiling: every output row re-reads the whole of the second matrix from memory"
               + (f", and the inner loop walks {strided[0][1]} with a stride (line {strided[0][0]})" if strided else ""))
        ev = roof + [Evidence(metric="loop nest", value=f"lines {outer.line}-{outer.last}, depth {len(chain)}, no tiling",
                              judged_against="tiles that fit in L1/L2", source="source")]
        out.drafts.append(Draft(
            "Tile the matmul loops and order them i-k-j",
            "Block the three loops into tiles that fit in cache (e.g. 64x64 of C, 256 of k), put k outside j so the "
            "innermost loop runs over a row of B and of C (unit stride, contiguous), keep the C tile's partial sums "
            "in registers or L1, and let that inner loop vectorize (`#pragma omp simd`).",
            f"line {outer.line}", why, f"most of {pct(share)} of the time: untiled matmuls run ~10x below tiled ones",
            "high", ev, share, gain=share * GAIN_GEMM_TILING, located=True))
        memory_claim(report, out, Claim("memory-bound", PRIORITY_CODE, why, ev, "medium", "memory-bound:cache"))
    verdicts = loop_verdicts(facts, compiler) if compiler is not None else {}
    explained: set[int] = set()  # inner loops a rule above already explains (the vectorizer's verdict included)
    for i in facts.innermost():
        if i in gemm_loops:
            continue
        loop = facts.loops[i]
        strided = facts.strided_subscripts(i)
        if not strided:
            continue
        explained.add(i)
        remarks = verdicts.get(i, [])
        ev = roof + [Evidence(metric="inner loop index", value=strided[0][1], judged_against=f"unit stride in {loop.var}",
                              source="source")]
        if remarks and not any(r.vectorized for r in remarks):
            ev.append(verdict_evidence(facts, i, remarks))
        why = (f"the inner loop over {loop.var} (line {loop.line}) reads {strided[0][1]}: consecutive iterations are "
               f"a row apart, so each 64-byte cache line gives one float and the loop cannot vectorize")
        out.drafts.append(Draft(
            "Make the inner loop unit-stride",
            f"Interchange the loops so the innermost one walks contiguous memory: iterate {loop.var} outside and the "
            f"index that is added without a stride inside (keep one accumulator per output in a small array or the "
            "output row itself); where the order cannot change, process a block of columns per pass so each cache "
            "line is used fully.",
            f"line {strided[0][0]}", why, f"most of {pct(share)} of the time: a strided walk moves up to 16x the bytes",
            "high" if remarks or roof else "medium", ev, share, gain=share * GAIN_STRIDED, located=True))
        memory_claim(report, out, Claim("memory-bound", PRIORITY_CODE, why, ev, "medium"))
    _serial(report, facts, out, share, roof)
    unvectorized_loops(facts, compiler, out, share, explained | gemm_loops)
    _scalar_math(facts, compiler, out, share, roof, code)
    _narrow_vectors(facts, compiler, out, share, code)
    _passes(report, facts, out, share)
    _atomics(facts, out, share)


def _serial(report: ProfileReport | None, facts: SourceFacts, out: Findings, share: float, roof: list[Evidence]) -> None:
    if facts.parallel_lines or not facts.loops:
        return
    cores = _cores(report)
    per_call = _own_us_per_call(report)
    outer = [loop for loop in facts.loops if loop.parent is None]
    if avoid := advised_against(report, facts):
        out.notes.append(f"the loops run on one core, but a call takes {per_call:.0f} us: under {PARALLEL_MIN_US:g} us "
                         "a parallel region costs about what it saves")
        out.avoid.update(avoid)
        return
    if cores < 2:
        return
    top = max(outer, key=lambda loop: loop.last - loop.line)
    ev = roof + [Evidence(metric="parallel constructs", value=0, judged_against="an OpenMP parallel loop over the "
                          "outer dimension", source="source"),
                 Evidence(metric="cores available", value=float(cores), judged_against="> 1", source="timing")]
    why = f"no loop is parallel: the candidate runs on 1 of the {cores} cores the baselines use"
    out.drafts.append(Draft(
        "Parallelize the outer loop",
        f"Put `#pragma omp parallel for` on the outer loop at line {top.line} (the build links OpenMP): each thread "
        "takes a contiguous block of iterations. Keep per-thread state inside the loop body.",
        f"line {top.line}", why, f"up to {pct(1 - 1 / cores)} of the candidate's time on {cores} cores",
        "high" if per_call is not None else "medium", ev, share, gain=share * (1 - 1 / cores), located=True))
    out.claims.append(Claim("latency-bound", PRIORITY_CODE, why, ev, "medium"))


def advised_against(report: ProfileReport | None, facts: SourceFacts | None) -> dict[str, str]:
    """Features the code lacks but should not get, with why: threads for a serial C++ call too short to split.
    The rules' drafts and a model's answers are pruned of them alike."""
    if facts is None or facts.parallel_lines or not facts.loops or facts.gpu_kernels or facts.triton_kernels:
        return {}
    per_call = _own_us_per_call(report)
    if per_call is None or _cores(report) < 2 or per_call >= PARALLEL_MIN_US:
        return {}
    return {"parallel": f"a call takes {per_call:.0f} us, too short for a parallel region to pay off"}


def _base(fn: str) -> str:
    """`expf` -> `exp`, `erff` -> `erf`, `erf` -> `erf`."""
    return fn[:-1] if fn.endswith("f") and fn[:-1] in _MATH_BASES else fn


def _symbols(fn: str) -> tuple[str, ...]:
    """The libm symbols a call compiles to: `exp` -> exp, expf (the float overload); `expf` -> expf."""
    if fn in _SCALAR_SYMBOL:
        return _SCALAR_SYMBOL[fn]
    return (fn,) if _base(fn) != fn else (fn, fn + "f")


def _names(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _scalar_math(facts: SourceFacts, compiler: CompilerFacts | None, out: Findings, share: float,
                 roof: list[Evidence], code: str) -> None:
    """The math calls of the hot loop that stay scalar libm calls: all of that loop's, named together.

    A function counts as scalar when the built library imports its scalar symbol and no libmvec variant of it
    (GCC keeps a scalar call for the loop's tail next to the vector one). Without the compiler's report every
    call of the loop counts, with less confidence."""
    if not facts.math_calls:
        return
    builds = compiler.builds if compiler else []
    imported = {s for b in builds for s in b.scalar_math}
    vector = [s for b in builds for s in b.vector_math]
    vectorized = {m.group(1) for s in vector if (m := _VECTOR_SYMBOL.match(s))}

    def scalar(fn: str) -> list[str]:
        return [s for s in _symbols(fn) if s in imported and s not in vectorized]

    calls = [(line, fn) for line, fn in facts.math_calls if scalar(fn)] if builds else list(facts.math_calls)
    if not calls:
        return  # the compiler vectorized them (or inlined them away): the library imports no scalar call
    line = calls[0][0]
    holding = [loop for loop in facts.loops if loop.first <= line <= loop.last]
    loop = min(holding, key=lambda lp: lp.last - lp.line) if holding else None
    if loop is not None:
        calls = [(n, fn) for n, fn in calls if loop.first <= n <= loop.last]
    fns = list(dict.fromkeys(fn for _, fn in calls))
    symbols = list(dict.fromkeys(s for fn in fns for s in scalar(fn)))
    ev = list(roof)
    if symbols:
        ev.append(Evidence(metric="scalar libm imports (nm -D)", value=", ".join(f"{s}@GLIBC" for s in symbols),
                           judged_against="libmvec _ZGV* vector variants" + (f" (found: {', '.join(vector)})" if vector else
                                                                              " (none imported)"), source="compiler"))
    fast = _FAST_MATH.search(code) is not None
    simd = loop is not None and loop.simd
    called = _names([f"{fn}()" for fn in fns])
    one = len(fns) == 1
    at = f"{fns[0]}() at line {line}" if one else _names([f"{fn}() (line {next(n for n, f in calls if f == fn)})"
                                                           for fn in fns])
    in_loop = "the hot loop" + (f" at line {loop.line}" if loop is not None else "")
    why = (f"{at} run{'s' if one else ''} inside {in_loop} as {'a scalar library call' if one else 'scalar library calls'}, "
           "one element at a time" + (" (the built library imports " + ", ".join(symbols) + " and no vector variant)"
                                      if symbols else ""))
    if simd:
        why += f": {'it stays' if one else 'they stay'} scalar even in this `#pragma omp simd` loop"
    elif loop is not None:
        why += (": the loop has no `#pragma omp simd`, and GCC does not vectorize a loop that calls a function it has "
                "no vector variant of")
    bases = list(dict.fromkeys(_base(fn) for fn in fns))
    variants = ", ".join(f"_ZGV*{s}" for s in (symbols or [f"{b}f" for b in bases]))
    then = "in the simd loop" if simd else "and vectorizes the loop at -O3 without a pragma"
    action = (f"Make the {_names(bases)} calls vectorize: add `-ffast-math` to extra_cflags, under which glibc's math.h "
              f"declares their vector variants (libmvec: {variants}), so GCC calls those {then}; `-fno-math-errno` "
              f"alone does not declare them. Or compute {'it' if one else 'them'} with vectorizable code (e.g. "
              f"at::vec::Vectorized<float>'s {_names(bases)}, or a range reduction and polynomial written in the loop).")
    if fast:
        action = (f"The flags allow vector math, yet {called} {'stays' if one else 'stay'} scalar: compute "
                  f"{'it' if one else 'them'} with vectorizable code in the loop (e.g. at::vec::Vectorized<float>) or "
                  "check that -march targets the host's vectors.")
    out.drafts.append(Draft(
        f"Vectorize the {called} calls", action, f"line {line}", why,
        f"most of the loop's time: a vector {bases[0]} does "
        "8-16 elements per call on AVX2/AVX-512",
        "high" if symbols else "medium", ev, share, gain=share * GAIN_SCALAR_MATH, located=True))
    out.claims.append(Claim("compute-bound", PRIORITY_CODE, why, ev, "medium" if symbols else "low"))


def _narrow_vectors(facts: SourceFacts, compiler: CompilerFacts | None, out: Findings, share: float, code: str) -> None:
    if compiler is None or _ARCH_FLAG.search(code):
        return
    for build in compiler.builds:
        narrow = [r for r in build.loops if r.vectorized and r.vector_bytes and build.host_vector_bytes
                  and r.vector_bytes < build.host_vector_bytes]
        if not narrow:
            continue
        first = narrow[0]
        ev = [Evidence(metric=f"vector width on line {first.line}", value=f"{first.vector_bytes} bytes",
                       judged_against=f"{build.host_vector_bytes} bytes (this CPU)", source="compiler")]
        out.drafts.append(Draft(
            "Compile for this CPU's vector width",
            f"Add `-march=native` to extra_cflags: the vectorized loops use {first.vector_bytes}-byte vectors, this CPU "
            f"has {build.host_vector_bytes}-byte ones.", f"line {first.line}",
            f"{len(narrow)} vectorized loop(s) use {first.vector_bytes}-byte vectors on a CPU with "
            f"{build.host_vector_bytes}-byte registers", "up to 2-4x in those loops when they are compute-bound",
            "medium", ev, share, gain=share * GAIN_WIDER_VECTORS, located=True, needs="compute-bound"))
        return


def _passes(report: ProfileReport | None, facts: SourceFacts, out: Findings, share: float) -> None:
    """Sibling passes over the same range that could be fewer (the shapes are in `_passes.py`)."""
    for group in pass_groups(facts):
        loops = [facts.loops[i] for i in group.loops]
        k, lines = len(loops), ", ".join(str(loop.line) for loop in loops)
        scope = "each row" if group.nested else "the data"
        # Over the whole tensor every pass streams it through memory; inside a row loop the row is likely in cache.
        streams = "" if group.nested else "; each pass over the whole tensor streams it through memory again"
        ev = [Evidence(metric="passes over the same range", value=f"{k} (lines {lines})", judged_against="1",
                      source="source")]
        if group.kind == "chain":
            arrays = ", ".join(group.arrays)
            title = f"Merge the {k} passes into one loop"
            action = (f"Compute each element's whole chain in one loop over the range (the loops at lines {lines}): keep "
                      f"the intermediate value ({arrays}) in a local variable instead of storing it and loading it back "
                      "in the next loop, and drop the temporary arrays' allocation.")
            why = (f"the loops at lines {lines} walk the same range, and each stores an intermediate ({arrays}) that "
                   f"the next loads back at the same index: {k} passes over memory where one does{streams}")
            gain, confidence = (GAIN_ONE_PASS, "medium") if group.nested else (GAIN_STREAM_PASSES * (1 - 1 / k), "high")
            effect = f"up to {pct(1 - 1 / k)} of the bytes the passes move"
            ev.append(Evidence(metric="intermediates stored and reloaded", value=arrays,
                               judged_against="kept in registers", source="source"))
        elif group.kind == "statistics":
            title = "Compute the statistics in one pass"
            action = (f"Read {group.arrays[0]} once: accumulate the sum and the sum of squares in the same loop (in "
                      "double), or use Welford's update (count, mean, M2), so the second statistic needs no second pass "
                      f"over {group.arrays[0]} (lines {lines}).")
            why = (f"the loop at line {loops[1].line} reads {group.arrays[0]} again to reduce it with what the loop at "
                   f"line {loops[0].line} reduced (a mean, then the spread around it){streams}")
            gain, confidence = (GAIN_ONE_PASS, "low") if group.nested else (GAIN_STREAM_PASSES / 2, "medium")
            effect = "one read of the input instead of two"
        else:
            title = f"Merge the {k} passes over {scope}"
            action = ("Each pass re-reads the data: combine them where the algorithm allows (e.g. an online max-and-sum "
                      "for softmax keeps a running maximum and rescales the running sum), so the data is read once or "
                      f"twice, not {k} times.")
            why = f"{k} loops over the same range (lines {lines}), each needing what the previous one reduced"
            gain, confidence = (GAIN_ONE_PASS, "low") if group.nested else (GAIN_STREAM_PASSES / 3, "medium")
            effect = ("fewer passes over memory; matters once a row no longer fits in L1/L2" if group.nested
                      else f"{k - 2} fewer passes over the data")
        out.drafts.append(Draft(title, action, f"line {loops[0].line}", why, effect, confidence, ev, share,
                                gain=share * gain, located=True))
        if group.kind == "chain" and not group.nested:
            memory_claim(report, out, Claim("memory-bound", PRIORITY_CODE, why, ev, "medium"))


def _atomics(facts: SourceFacts, out: Findings, share: float) -> None:
    if not facts.atomics:
        return
    line = facts.atomics[0]
    out.drafts.append(Draft(
        "Take the atomic out of the hot loop",
        "Accumulate per thread (a reduction clause, a register, or a shared-memory / warp-shuffle reduction on GPUs) "
        "and combine the partial results once per thread or block.", f"line {line}",
        f"an atomic update at line {line} runs on every iteration; threads serialize on the same address",
        "contended atomics cost 10-100x a plain add", "medium",
        [Evidence(metric="atomics in loops", value=float(len(facts.atomics)), judged_against="0", source="source")],
        share, gain=share * GAIN_ATOMICS, located=True))


def code_findings(report: ProfileReport | None, facts: SourceFacts, compiler: CompilerFacts | None,
                  family: str, out: Findings) -> None:
    """Add the code's findings to `out`: CPU loop rules for C++, GPU rules for CUDA/Triton kernels."""
    if family == "cpu":
        _cpu_rules(report, facts, compiler, out)
    else:
        gpu_findings(report, facts, compiler, out)
        if facts.atomics:
            _atomics(facts, out, own_share(report))
