"""What changed between two profiles, and where a named kernel is defined in the candidate's code."""

from __future__ import annotations

import re

from kforge.profilers.report import ProfileReport, format_us
from kforge.profilers.torch_profiler import CUSTOM_PREFIX

__all__ = ["TOP_OPS", "describe_changes", "locate_definition", "top_op_names"]

TOP_OPS = 5  # ops compared between profiles: enough to see a fusion land, few enough to read

# 'kforge::ext.fn' -> 'fn'; a bare kernel name 'add_kernel(float*, int)' -> 'add_kernel'.
_CUSTOM_NAME = re.compile(rf"^{re.escape(CUSTOM_PREFIX)}[\w-]+\.(\w+)$")
_KERNEL_NAME = re.compile(r"^(?:void\s+)?([A-Za-z_]\w*)\s*(?:[<(].*)?$")


def top_op_names(report: ProfileReport, n: int = TOP_OPS) -> list[str]:
    """The `n` ops with the largest share, largest first; ties by name so the order is stable."""
    return [r.name for r in sorted(report.ops, key=lambda r: (-r.share, r.name))[:n]]


def _speedup(report: ProfileReport, name: str) -> float | None:
    return next((b.speedup for b in report.baselines if b.name == name), None)


def describe_changes(previous: ProfileReport, current: ProfileReport) -> list[str]:
    """One line per comparable fact: median, speedups, custom share, top-op churn."""
    changes = []
    p, c = previous.candidate, current.candidate
    if p is not None and c is not None and c.median_us > 0 and p.median_us > 0:
        ratio = p.median_us / c.median_us
        # A change smaller than either run's own spread (IQR / median) is not a change.
        spread = max(p.iqr_us / p.median_us, c.iqr_us / c.median_us)
        verdict = "within the timing spread" if abs(ratio - 1) <= spread else ("faster" if ratio > 1 else "slower")
        changes.append(f"candidate median {format_us(p.median_us)} -> {format_us(c.median_us)} "
                       f"(x{ratio:.2f}, {verdict})")
    names = [b.name for b in current.baselines] + [b.name for b in previous.baselines
                                                   if b.name not in {x.name for x in current.baselines}]
    for name in names:
        before, after = _speedup(previous, name), _speedup(current, name)
        if before is not None and after is not None:
            changes.append(f"speedup vs {name} x{before:.2f} -> x{after:.2f}")
    if previous.custom_share is not None and current.custom_share is not None:
        changes.append(f"custom share {100 * previous.custom_share:.0f}% -> {100 * current.custom_share:.0f}%")
    before_top, after_top = top_op_names(previous), top_op_names(current)
    if appeared := [n for n in after_top if n not in before_top]:
        changes.append(f"new in the top {TOP_OPS} ops: {', '.join(appeared)}")
    if gone := [n for n in before_top if n not in after_top]:
        changes.append(f"gone from the top {TOP_OPS} ops: {', '.join(gone)}")
    if not changes:
        changes.append("no comparable measurements between the two profiles")
    return changes


def _function_name(where: str) -> str | None:
    if m := _CUSTOM_NAME.match(where):
        return m.group(1)
    if "::" in where:
        return None  # a framework op (aten::mul), not something the candidate defines
    m = _KERNEL_NAME.match(where.strip())
    return m.group(1) if m else None


def locate_definition(where: str, code: str) -> int | None:
    """The 1-based line of `code` that defines the function named by `where`, or None.

    Tried in order: a Python `def fn(` (Triton kernels, wrappers); a C++/CUDA definition (a type
    before `fn(` on a line not ending in ';'); then any line with `fn(`, such as a declaration.
    """
    fn = _function_name(where)
    if fn is None:
        return None
    name = re.escape(fn)
    patterns = [re.compile(rf"^\s*def\s+{name}\s*\("),
                re.compile(rf"^\s*(?!return\b)(?:[\w:<>,]+[\s*&]+)+{name}\s*\((?!.*;\s*$)"),
                re.compile(rf"\b{name}\s*\(")]
    lines = code.splitlines()
    for pattern in patterns:
        for number, line in enumerate(lines, start=1):
            if pattern.search(line):
                return number
    return None
