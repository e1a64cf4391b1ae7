"""The "never recommend what is already there" rule, for the built-in rules and model answers alike.

A recommendation proposes features (a parallel loop, simd, tiling, fusion, tensor cores, -march, the
read-only cache path of `const __restrict__` / `__ldg`); where the candidate already has one, the
sentences proposing it are cut, and a recommendation left with nothing to do is dropped with a note
that says what the code already has and where.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kforge.profilers.report import ProfileReport

from .source import SourceFacts

__all__ = ["Present", "already_present", "fully_fused", "prune"]

# What a sentence proposes. Vector *math* (exp, log, ...) is not simd: a loop with `omp simd` can still
# call scalar exp, and advice to vectorize that call is right.
_PROPOSES = {
    "parallel": re.compile(r"omp parallel|parallel for|paralleli[sz]e|at::parallel_for|multi-?thread", re.I),
    "simd": re.compile(r"omp simd|\bvectori[sz]e (the |its |your )?(contiguous |inner |innermost )?loop", re.I),
    "tiling": re.compile(r"\btil(e|es|ing)\b|\bblock the loops|cache[- ]block", re.I),
    # Fusing ops or kernels; fusing passes inside one kernel is other advice.
    "fusion": re.compile(r"\bfus(e|ing)\b[^.]*\b(ops?|kernels?|launch(es)?)\b|\bfusion\b|into one (kernel|launch)|"
                         r"single kernel", re.I),
    "tensor cores": re.compile(r"tensor cores?|\bwmma\b|mma\.sync|tl\.dot", re.I),
    "-march": re.compile(r"-march=native", re.I),
    "read-only cache": re.compile(r"__restrict(__)?\b|__ldg\b|read-only (data |texture )?cache|non-coherent|"
                                  r"ld\.global\.nc|texture cache", re.I),
}
_VECTOR_MATH = re.compile(r"\b(exp|expf|log|tanh|sin|cos|pow|erf|libmvec|math)\b", re.I)
_SIMD_PRAGMA = re.compile(r"omp\s+(parallel\s+for\s+)?simd", re.I)
_SENTENCE = re.compile(r"(?<=[.;])\s+(?=[A-Z`(])")


@dataclass(frozen=True)
class Present:
    """A feature the candidate already has, and the line that shows it."""

    feature: str
    line: int | None
    how: str


def already_present(facts: SourceFacts | None, report: ProfileReport | None) -> dict[str, Present]:
    """Features the candidate has, by the names in `_PROPOSES`."""
    found: dict[str, Present] = {}
    if facts is not None:
        code = "\n".join(facts.lines)
        if facts.parallel_lines:
            n = facts.parallel_lines[0]
            found["parallel"] = Present("parallel", n, facts.lines[n - 1].strip())
        simd = [loop for loop in facts.loops if loop.simd]
        innermost = [facts.loops[i] for i in facts.innermost()]
        if simd and all(loop.simd for loop in innermost):
            found["simd"] = Present("simd", simd[0].line - 1, "#pragma " + next(p for p in simd[0].pragmas if "simd" in p))
        tiled = [loop for loop in facts.loops if loop.step]
        if tiled:
            found["tiling"] = Present("tiling", tiled[0].line, f"the loop steps by a tile ({tiled[0].step})")
        elif m := re.search(r"__shared__|tl\.dot", code):
            found["tiling"] = Present("tiling", code.count("\n", 0, m.start()) + 1, m.group(0))
        if m := re.search(r"\bwmma::|mma\.sync|tl\.dot", code):
            found["tensor cores"] = Present("tensor cores", code.count("\n", 0, m.start()) + 1, m.group(0))
        if m := re.search(r"[\"']-march=native", code):
            found["-march"] = Present("-march", code.count("\n", 0, m.start()) + 1, "-march=native")
        # Only where no kernel reads an input off that path: otherwise advice to mark that input is right.
        if facts.read_only_marked is not None and not facts.uncached_inputs:
            line, how = facts.read_only_marked
            found["read-only cache"] = Present("read-only cache", line, how)
    if report is not None and fully_fused(report):
        custom = next(r for r in report.ops if r.is_custom)
        found["fusion"] = Present("fusion", None, f"one kernel of yours ({custom.name}) does the whole forward")
    return found


def fully_fused(report: ProfileReport) -> bool:
    """One custom op, called once per forward, holding nearly all op time: nothing left to fuse."""
    custom = [r for r in report.ops if r.is_custom]
    if len(custom) != 1 or report.custom_share is None or report.custom_share < 0.9:
        return False
    calls = report.profiled_calls or custom[0].calls
    return custom[0].calls <= max(1, calls)


def _proposes(text: str, feature: str) -> bool:
    if not _PROPOSES[feature].search(text):
        return False
    # Naming the pragma proposes it, even in a sentence about exp ("add omp simd to the exp loop"); only the
    # wording "vectorize the loop" may mean vector math instead.
    return not (feature == "simd" and not _SIMD_PRAGMA.search(text) and _VECTOR_MATH.search(text))


def prune(title: str, action: str, present: dict[str, Present]) -> tuple[str | None, list[str]]:
    """(the action without sentences proposing what is present, or None to drop it; what was cut, in words)."""
    said = []
    if not present:
        return action, said
    for feature, p in present.items():
        if _proposes(title, feature):
            if p.line is None and feature != "fusion":  # not in the code: advised against (see Findings.avoid)
                return None, [f"dropped '{title}': {p.how}"]
            where = f" (line {p.line}: {p.how})" if p.line else f" ({p.how})"
            return None, [f"dropped '{title}': the code already has {feature}{where}"]
    kept = []
    for sentence in _SENTENCE.split(action):
        hit = next((p for f, p in present.items() if _proposes(sentence, f)), None)
        if hit is None:
            kept.append(sentence)
        else:
            said.append(f"cut advice to add {hit.feature} from '{title}': already there"
                        + (f" (line {hit.line})" if hit.line else f" ({hit.how})"))
    if not kept:
        return None, [f"dropped '{title}': everything it proposed is already there"]
    return " ".join(kept), said
