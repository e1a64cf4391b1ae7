"""Parse pasted profiler output into a `ProfileReport`: torch.profiler tables and Nsight Compute details.

Recognized, tried in this order:
  * torch.profiler `prof.key_averages().table(...)`: header-driven, so missing or extra columns
    (device time, memory, shapes) are tolerated; `collector="torch.profiler"`.
  * Nsight Compute `ncu --csv --page details` rows and the plain-text `ncu` details page;
    `collector="ncu"` (see `_ncu.py`).
Pasted text carries no timing, baselines or profiled-call count, so those stay empty.
"""

from __future__ import annotations

import re

from kforge.profilers.report import OpRow, ProfileReport
from kforge.profilers.torch_profiler import CUSTOM_PREFIX

from ._ncu import parse_ncu_text

__all__ = ["PASTED_NOTE", "parse_profile_text", "parse_time_us"]

PASTED_NOTE = "parsed from pasted text: no timing, no baselines and no profiled-call count"

_DASH_LINE = re.compile(r"^\s*-{3,}(?:\s+-{3,})+\s*$")
# Cells are separated by at least two spaces; names and values never contain two in a row.
_CELL_SPLIT = re.compile(r"\s{2,}")
_TIME = re.compile(r"^(-?[\d.]+)\s*(ns|us|ms|s)$")
_TIME_TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
_TOTAL_LINE = re.compile(r"^\s*Self (\w+) time total:\s*(\S+)\s*$")


def parse_time_us(cell: str) -> float | None:
    """'1.234ms' -> 1234.0; '56.000us' -> 56.0; anything else (e.g. '--') -> None."""
    m = _TIME.match(cell.strip())
    return float(m.group(1)) * _TIME_TO_US[m.group(2)] if m else None


def _number(cell: str) -> float | None:
    try:
        return float(cell.strip().rstrip("%").replace(",", ""))
    except ValueError:
        return None


def parse_profile_text(text: str) -> ProfileReport | None:
    """Parse pasted profiler output; None when it is not a format listed in the module docstring."""
    return _parse_torch_table(text) or parse_ncu_text(text)


def _columns(lines: list[str]) -> tuple[int, list[str], list[tuple[int, int]]] | None:
    """Find the table header: (index of the first data row, column names, column spans).

    The header is a line of names between two lines of dashes; the dashes give each column's span.
    Names are read by splitting on double spaces, because a name wider than its column (e.g.
    'CUDA time avg' in a 12-wide column) pushes the rest of the header line out of its spans.
    """
    for i in range(len(lines) - 2):
        if not (_DASH_LINE.match(lines[i]) and _DASH_LINE.match(lines[i + 2])):
            continue
        names = _CELL_SPLIT.split(lines[i + 1].strip())
        if not names or names[0] != "Name":
            continue
        spans = [m.span() for m in re.finditer(r"-+", lines[i])]
        if len(spans) == len(names):
            return i + 3, names, spans
    return None


def _cells(line: str, names: list[str], spans: list[tuple[int, int]]) -> dict[str, str] | None:
    """One data row as {column name: cell}: split on double spaces, or cut at the spans if that fails."""
    tokens = _CELL_SPLIT.split(line.strip())
    if len(tokens) == len(names):
        return dict(zip(names, tokens))
    if len(line.rstrip()) < spans[-1][0]:
        return None  # a wrapped continuation line (stack entries), not a row
    # Empty cells (e.g. a blank 'Overload Name') break the split; the column spans still hold.
    return {n: line[a:b].strip() for n, (a, b) in zip(names, spans)}


def _device_of(names: list[str]) -> str | None:
    """'CUDA' when the table has a 'Self CUDA' column (or XPU, MTIA...), None for a CPU-only table."""
    for n in names:
        m = re.fullmatch(r"Self (\w+)", n)
        if m and m.group(1) != "CPU":
            return m.group(1)
    return None


def _parse_torch_table(text: str) -> ProfileReport | None:
    lines = text.splitlines()
    found = _columns(lines)
    if found is None:
        return None
    start, names, spans = found
    device = _device_of(names)
    rows: list[dict[str, float | str | None]] = []
    totals: dict[str, float] = {}
    for line in lines[start:]:
        if _DASH_LINE.match(line):
            break
        cells = _cells(line, names, spans)
        if cells is None or not cells.get("Name"):
            continue
        calls = _number(cells.get("# of Calls", ""))
        rows.append({"name": cells["Name"], "calls": calls,
                     "self_cpu": parse_time_us(cells.get("Self CPU", "")),
                     "cpu_total": parse_time_us(cells.get("CPU total", "")),
                     "self_dev": parse_time_us(cells.get(f"Self {device}", "")) if device else None,
                     "dev_total": parse_time_us(cells.get(f"{device} total", "")) if device else None})
    for line in lines[start:]:
        m = _TOTAL_LINE.match(line)
        if m and (us := parse_time_us(m.group(2))) is not None:
            totals[m.group(1)] = us
    if not rows or all(r["self_cpu"] is None and r["self_dev"] is None for r in rows):
        return None
    return _torch_report(rows, totals, device)


def _torch_report(rows: list[dict], totals: dict[str, float], device: str | None) -> ProfileReport:
    """Turn parsed rows into OpRows; shares use device time when the table has it, else CPU time."""
    by_device = device is not None and any(r["self_dev"] for r in rows)
    self_key, total_key = ("self_dev", "dev_total") if by_device else ("self_cpu", "cpu_total")
    # The 'Self X time total' line covers rows cut by row_limit too; the row sum is the fallback.
    window_us = totals.get(device if by_device else "CPU") or sum(r[self_key] or 0.0 for r in rows) or 1.0
    ops = []
    for r in rows:
        self_us = r["self_cpu"] if r["self_cpu"] is not None else (r["cpu_total"] or 0.0)
        ops.append(OpRow(name=str(r["name"]), calls=int(r["calls"] or 0), self_time_us=self_us,
                         total_time_us=r["cpu_total"] if r["cpu_total"] is not None else self_us,
                         device_time_us=r["self_dev"], share=(r[self_key] or 0.0) / window_us,
                         is_custom=str(r["name"]).startswith(CUSTOM_PREFIX)))
    custom = [r for r in rows if str(r["name"]).startswith(CUSTOM_PREFIX)]
    # A labelled range's total covers the kernel and the ops it launched, as in tools/profile.py.
    custom_us = sum((r[total_key] if r[total_key] is not None else r[self_key]) or 0.0 for r in custom)
    notes = [PASTED_NOTE]
    if any(r["calls"] is None for r in rows):
        notes.append("the table has no '# of Calls' column; call counts are unknown (0)")
    return ProfileReport(backend=device.lower() if by_device and device else "cpu",
                         device_name="unknown (pasted torch.profiler table)", collector="torch.profiler",
                         ops=tuple(ops), custom_share=min(1.0, custom_us / window_us), notes=tuple(notes))
