"""Innermost loops the compiler reported as not vectorized, with the compiler's reason turned into the change.

The vectorizer's report (gathered in the normal build) says per loop whether it vectorized and why not; the
candidate's agent cannot see it. Reasons other rules already explain are left to them: a strided index (the
unit-stride rule), a math call (the vector-math rule), a matmul nest (the tiling rule). A loop on 4-16 lanes
instead of one runs its arithmetic several times faster; in a memory-bound loop less, so the gain is rough.
"""

from __future__ import annotations

import re

from kforge.profilers.compiler_report import CompilerFacts, LoopRemark

from ._findings import Draft, Findings, pct
from .base import Evidence
from .source import SourceFacts

__all__ = ["inner_loop_evidence", "loop_verdicts", "unvectorized_loops", "verdict_evidence"]

GAIN_VECTORIZE = 0.5

# A math call in a loop is a branch for GCC while it may set errno (sqrt, log of a negative number).
_MATH_CALL = re.compile(r"(?<![\w.])(?:std::)?(?:sqrt|exp|log|pow|sin|cos|tanh|erf|cbrt|atan2?)f?\s*\(")
_CONTROL_FLOW = ("Let the compiler evaluate both sides of the branch and select per lane: add `-fno-trapping-math` "
                 "to extra_cflags (by default GCC may not compute a value the branch would skip, in case it raises a "
                 "floating-point exception){math}, write the body as one store per iteration (`o[i] = cond ? a : b`) "
                 "with no `break`, and move conditions that do not depend on the loop index out of the loop.")
_MATH_FLAGS = (" and `-fno-math-errno` (the math call in the loop may set errno, which keeps it a branch; both "
               "flags are part of -ffast-math)")

# (words in the compiler's reason, the change that removes it); the first match wins.
_CHANGES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("control flow",), _CONTROL_FLOW),
    (("number of iterations cannot be computed", "not a counted loop", "latch", "exit"),
     ("Give the loop a trip count the compiler can compute before it starts: a plain `for (int64_t i = 0; i < n; "
      "++i)` with `n` in a local variable, no `break` or early `return` inside (compute a mask instead).")),
    (("alias", "dependence", "data ref analysis"),
     ("Tell the compiler the arrays do not overlap: declare the pointers `float* __restrict__` (or copy the "
      "bounds and pointers into local variables), so no store can change what the next iteration loads.")),
    (("unsafe fp math", "reduction"),
     ("Let the reduction be reordered: `#pragma omp simd reduction(+:acc)` on the loop, or `-fassociative-math` "
      "(part of `-ffast-math`) in extra_cflags; without either, GCC keeps the sum's order and one lane.")),
    (("complicated access pattern", "gather", "not suitable", "no vectype", "unsupported"),
     ("Make every array access in the loop `base[i]` with `i` the loop index (unit stride, no index loaded from "
      "another array): gather the values into a contiguous buffer first, or change the layout.")),
)
_GENERIC = ("Rewrite the loop body as a straight line over contiguous arrays indexed by the loop variable; the "
            "compiler's reason is in the evidence.")


# `m = std::max(m, x)` returns a reference: GCC keeps it a branch ("control flow") even with -ffast-math and an
# `omp simd reduction(max:m)`, where `m = x > m ? x : m` vectorizes at plain -O3 (g++ 12, checked).
_STD_MINMAX = re.compile(r"\bstd::(max|min)\s*\(")
_MINMAX = ("Write the `std::{fn}` in the loop as a conditional expression (`m = x {op} m ? x : m`): std::{fn} returns a "
           "reference, which GCC keeps as a branch (\"control flow\") even under `-ffast-math` and with a {fn} "
           "reduction clause, while the conditional expression becomes a vector {fn}.")


def _change(reasons: list[str], body: str) -> str:
    text = " ".join(reasons).lower()
    if "control flow" in text and (m := _STD_MINMAX.search(body)):
        return _MINMAX.format(fn=m.group(1), op=">" if m.group(1) == "max" else "<")
    change = next((change for words, change in _CHANGES if any(w in text for w in words)), _GENERIC)
    return change.format(math=_MATH_FLAGS if _MATH_CALL.search(body) else "")


def loop_verdicts(facts: SourceFacts, compiler: CompilerFacts) -> dict[int, list[LoopRemark]]:
    """The compiler's remarks per loop (index into facts.loops). GCC puts a loop's remark on its `for` line or,
    for an `omp parallel for` loop it outlines, on the body's first statement: each remark goes to the innermost
    loop whose lines hold it. A remark on an `omp simd` pragma's line is about the loops GCC adds for the
    reduction clause (the per-lane copies), not the user's loop: it goes to the enclosing loop, if any."""
    spans = [(loop.line, loop.last, i) for i, loop in enumerate(facts.loops)]
    out: dict[int, list[LoopRemark]] = {}
    for remark in (r for b in compiler.builds for r in b.loops if r.line is not None):
        holding = [(last - first, i) for first, last, i in spans if first <= remark.line <= last]
        if holding:
            out.setdefault(min(holding)[1], []).append(remark)
    return out


def unvectorized_loops(facts: SourceFacts, compiler: CompilerFacts | None, out: Findings, share: float,
                       explained: set[int]) -> None:
    """One draft for the first innermost loop the compiler did not vectorize, other than the `explained` loops
    (indices into facts.loops) and loops calling math functions; the others it names in the evidence."""
    if compiler is None or not compiler.builds:
        return
    verdicts = loop_verdicts(facts, compiler)
    math_lines = {line for line, _ in facts.math_calls}
    missed: list[tuple[int, LoopRemark]] = []
    for i in facts.innermost():
        loop = facts.loops[i]
        remarks = verdicts.get(i, [])
        if i in explained or not remarks or any(r.vectorized for r in remarks):
            continue
        if any(loop.line <= n <= loop.last for n in math_lines):
            continue  # the vector-math rule speaks for it
        reasons = [m for r in remarks for m in r.missed]
        missed.append((i, LoopRemark(line=loop.line, origin=remarks[0].origin, vectorized=False,
                                     missed=list(dict.fromkeys(reasons))[:3])))
    if not missed:
        return
    i, remark = missed[0]
    loop = facts.loops[i]
    reasons = remark.missed or ["couldn't vectorize loop"]
    ev = [verdict_evidence(facts, i, verdicts[i])]
    if len(missed) > 1:
        ev.append(Evidence(metric="other loops not vectorized", value=", ".join(f"line {facts.loops[j].line}"
                                                                               for j, _ in missed[1:]),
                           judged_against="vectorized", source="compiler"))
    why = (f"the compiler did not vectorize the inner loop at line {loop.line} ({reasons[0].rstrip('.')}): it runs one "
           "element per instruction where the CPU's vectors hold 4-16")
    out.drafts.append(Draft(
        f"Make the loop at line {loop.line} vectorize", _change(reasons, "\n".join(facts.lines[loop.line - 1:loop.last])),
        f"line {loop.line}", why,
        f"most of {pct(share)} of the time where the loop's arithmetic, not memory, is the cost: 4-16 lanes instead of one",
        "medium", ev, share, gain=share * GAIN_VECTORIZE, located=True))


def verdict_evidence(facts: SourceFacts, index: int, remarks: list[LoopRemark]) -> Evidence:
    """The vectorizer's verdict on loop `index` (of facts.loops) as one Evidence: every rule that cites it cites the
    same fact, so the analysis lists it once."""
    done = [r for r in remarks if r.vectorized]
    width = max((r.vector_bytes or 0 for r in done), default=0)
    value = (f"vectorized ({width}-byte vectors)" if width else "vectorized") if done else \
        "not vectorized: " + ("; ".join(dict.fromkeys(m for r in remarks for m in r.missed)) or "couldn't vectorize loop")
    return Evidence(metric=f"vectorizer on the loop at line {facts.loops[index].line}", value=value,
                    judged_against="vectorized", source="compiler")


def inner_loop_evidence(facts: SourceFacts, compiler: CompilerFacts | None, limit: int = 4) -> list[Evidence]:
    """Whether each inner loop vectorized, by the compiler's word: the fact an agent cannot see for itself."""
    if compiler is None or not compiler.builds:
        return []
    verdicts = loop_verdicts(facts, compiler)
    return [verdict_evidence(facts, i, verdicts[i]) for i in facts.innermost() if verdicts.get(i)][:limit]
