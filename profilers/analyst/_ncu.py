"""Recognize Nsight Compute details output (`ncu --csv --page details`, or ncu's plain-text page).

Metrics become `Counter`s and kernels with a 'Duration' become `OpRow`s (device time). Counters of
the kernel with the most total duration (the first kernel when none has one) keep their plain
metric names ('DRAM Throughput'), which the rules read; other kernels' metrics are named
'<metric> [<kernel>]' so nothing is lost and nothing is ambiguous.
"""

from __future__ import annotations

import csv
import io
import re

from kforge.profilers.report import Counter, OpRow, ProfileReport
from kforge.profilers.torch_profiler import CUSTOM_PREFIX

__all__ = ["parse_ncu_text"]

_PASTED_NOTE = "parsed from pasted Nsight Compute output: no timing and no baselines"
_REQUIRED_CSV = ("Kernel Name", "Metric Name", "Metric Value")
_DURATION_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
                   "second": 1e6, "s": 1e6}
# '  name(args) (64, 1, 1)x(32, 1, 1), Context 1, Stream 7, Device 0, CC 9.0'
_KERNEL_LINE = re.compile(r"^\s*(?P<name>\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), Context \d+, Stream \d+"
                          r"(?:, Device \d+)?(?:, CC (?P<cc>[\d.]+))?")
_SECTION_LINE = re.compile(r"^\s*Section: (.+?)\s*$")
_CELL_SPLIT = re.compile(r"\s{2,}")
_SHORT_NAME_CHARS = 60
# ncu's rule verdicts ('OPT   This kernel grid is too small ...') share the sections with metrics.
_RULE_TYPES = frozenset({"OPT", "WRN", "INF", "ERR"})

# One launch: (launch id, kernel name) -> [(metric, unit, value)]
_Launches = dict[tuple[str, str], list[tuple[str, str, float]]]


def _value(cell: str) -> float | None:
    try:
        return float(cell.strip().replace(",", ""))  # ncu writes thousands separators: '14,329'
    except ValueError:
        return None  # text-valued metrics such as 'CachePreferNone'


def parse_ncu_text(text: str) -> ProfileReport | None:
    """Parse ncu details (CSV or plain text); None when `text` is neither."""
    launches, cc = _parse_csv(text)
    if not launches:
        launches, cc = _parse_plain(text)
    if not launches:
        return None
    return _report(launches, cc)


def _parse_csv(text: str) -> tuple[_Launches, str | None]:
    lines = text.splitlines()
    # ncu prints '==PROF==' progress lines before the CSV when stdout and stderr are mixed.
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return {}, None
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    if reader.fieldnames is None or any(f not in reader.fieldnames for f in _REQUIRED_CSV):
        return {}, None
    launches: _Launches = {}
    cc = None
    for row in reader:
        value = _value(row.get("Metric Value") or "")
        if value is None or not row.get("Kernel Name"):
            continue
        cc = cc or row.get("CC")
        key = (row.get("ID") or "", row["Kernel Name"])
        launches.setdefault(key, []).append((row["Metric Name"], row.get("Metric Unit") or "", value))
    return launches, cc


def _parse_plain(text: str) -> tuple[_Launches, str | None]:
    launches: _Launches = {}
    cc = None
    key: tuple[str, str] | None = None
    in_section = False
    for line in text.splitlines():
        if m := _KERNEL_LINE.match(line):
            key = (str(len(launches)), m.group("name"))
            launches[key] = []
            cc = cc or m.group("cc")
            in_section = False
        elif _SECTION_LINE.match(line):
            in_section = key is not None
        elif in_section and key is not None and (metric := _metric_line(line)):
            launches[key].append(metric)
    return {k: v for k, v in launches.items() if v}, cc


def _metric_line(line: str) -> tuple[str, str, float] | None:
    """'    DRAM Throughput      %      85.21' -> ('DRAM Throughput', '%', 85.21); other lines -> None."""
    tokens = _CELL_SPLIT.split(line.strip())
    if tokens[0] in _RULE_TYPES:
        return None
    if len(tokens) == 2 and " " in tokens[1] and _value(tokens[1].rsplit(" ", 1)[1]) is not None:
        tokens = [tokens[0], *tokens[1].rsplit(" ", 1)]  # unit and value separated by a single space
    if len(tokens) == 3 and (value := _value(tokens[2])) is not None:
        return tokens[0], tokens[1], value
    if len(tokens) == 2 and (value := _value(tokens[1])) is not None:
        return tokens[0], "", value
    return None


def _duration_us(metrics: list[tuple[str, str, float]]) -> float | None:
    for name, unit, value in metrics:
        if name == "Duration" and unit in _DURATION_TO_US:
            return value * _DURATION_TO_US[unit]
    return None


def _short(kernel: str) -> str:
    return kernel.split("(", 1)[0].strip()[:_SHORT_NAME_CHARS]


def _report(launches: _Launches, cc: str | None) -> ProfileReport:
    per_kernel: dict[str, list[float]] = {}
    for (_, kernel), metrics in launches.items():
        duration = _duration_us(metrics)
        if duration is not None:
            per_kernel.setdefault(kernel, []).append(duration)
    window_us = sum(sum(d) for d in per_kernel.values()) or 1.0
    ops = sorted((OpRow(name=k, calls=len(d), self_time_us=sum(d), total_time_us=sum(d), device_time_us=sum(d),
                        share=sum(d) / window_us, is_custom=k.startswith(CUSTOM_PREFIX))
                  for k, d in per_kernel.items()), key=lambda r: (-r.self_time_us, r.name))
    # The top kernel's longest launch speaks for it; ties keep the order ncu printed.
    top_kernel = ops[0].name if ops else next(iter(launches))[1]
    top_key = max((k for k in launches if k[1] == top_kernel), key=lambda k: _duration_us(launches[k]) or 0.0)
    counters = [Counter(name=n, unit=u, value=v) for n, u, v in launches[top_key]]
    counters += [Counter(name=f"{n} [{_short(kernel)}]", unit=u, value=v)
                 for (lid, kernel), metrics in launches.items() if (lid, kernel) != top_key
                 for n, u, v in metrics]
    notes = [_PASTED_NOTE, "ncu cannot tell the candidate's kernels from framework kernels: custom share unknown"]
    if not ops:
        notes.append("no 'Duration' metric in the ncu output: kernel times are unknown")
    return ProfileReport(backend="cuda", device_name=f"GPU (compute capability {cc})" if cc else "GPU (from ncu)",
                         collector="ncu", ops=tuple(ops), counters=tuple(counters), notes=tuple(notes))
