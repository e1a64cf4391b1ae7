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

from kforge.profilers.report import Counter, NcuKernel, OpRow, ProfileReport
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
_DASH_LINE_RE = re.compile(r"^\s*-{3,}")
_CELL_SPLIT = re.compile(r"\s{2,}")
_SHORT_NAME_CHARS = 60
# ncu's rule verdicts ('OPT   This kernel grid is too small ...') share the sections with metrics.
_RULE_TYPES = frozenset({"OPT", "WRN", "INF", "ERR"})

# One launch: (launch id, kernel name) -> [(metric, unit, value)]
_Launches = dict[tuple[str, str], list[tuple[str, str, float]]]
# ncu's rule findings per launch: (launch id, kernel name) -> [{"rule", "title", "message"}]
_Rules = dict[tuple[str, str], list[dict[str, str]]]


def _value(cell: str) -> float | None:
    try:
        return float(cell.strip().replace(",", ""))  # ncu writes thousands separators: '14,329'
    except ValueError:
        return None  # text-valued metrics such as 'CachePreferNone'


def parse_ncu_text(text: str) -> ProfileReport | None:
    """Parse ncu details (CSV or plain text); None when `text` is neither."""
    launches, rules, cc = _parse_csv(text)
    if not launches:
        launches, rules, cc = _parse_plain(text)
    if not launches:
        return None
    return _report(launches, rules, cc)


def _parse_csv(text: str) -> tuple[_Launches, _Rules, str | None]:
    lines = text.splitlines()
    # ncu prints '==PROF==' progress lines before the CSV when stdout and stderr are mixed.
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return {}, {}, None
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    if reader.fieldnames is None or any(f not in reader.fieldnames for f in _REQUIRED_CSV):
        return {}, {}, None
    launches: _Launches = {}
    rules: _Rules = {}
    cc = None
    for row in reader:
        if not row.get("Kernel Name"):
            continue
        key = (row.get("ID") or "", row["Kernel Name"])
        if row.get("Rule Name") and row.get("Rule Type") in _RULE_TYPES - {"INF"}:
            rules.setdefault(key, []).append({"rule": row["Rule Name"], "title": "",
                                              "message": row.get("Rule Description") or ""})
        value = _value(row.get("Metric Value") or "")
        if value is None or not row.get("Metric Name"):
            continue
        cc = cc or row.get("CC")
        launches.setdefault(key, []).append((row["Metric Name"], row.get("Metric Unit") or "", value))
    return launches, rules, cc


def _parse_plain(text: str) -> tuple[_Launches, _Rules, str | None]:
    launches: _Launches = {}
    rules: _Rules = {}
    cc = None
    key: tuple[str, str] | None = None
    in_section = False
    rule: dict[str, str] | None = None  # the OPT/WRN paragraph being read
    for line in text.splitlines():
        tokens = _CELL_SPLIT.split(line.strip())
        if m := _KERNEL_LINE.match(line):
            key = (str(len(launches)), m.group("name"))
            launches[key] = []
            cc = cc or m.group("cc")
            in_section, rule = False, None
        elif _SECTION_LINE.match(line):
            in_section, rule = key is not None, None
        elif in_section and key is not None and tokens[0] in _RULE_TYPES:
            # 'OPT   Est. Speedup: 82%' or 'OPT   This kernel ...': the message runs on indented lines.
            rule = None
            if tokens[0] != "INF":
                first = " ".join(tokens[1:])
                rule = {"rule": "", "title": "", "message": "" if first.startswith("Est.") else first}
                rules.setdefault(key, []).append(rule)
        elif rule is not None and line.strip() and not _DASH_LINE_RE.match(line):
            rule["message"] = (rule["message"] + " " + line.strip()).strip()
        elif in_section and key is not None and (metric := _metric_line(line)):
            launches[key].append(metric)
        elif not line.strip():
            rule = None  # a blank line ends a rule's paragraph
    return {k: v for k, v in launches.items() if v}, rules, cc


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


def _by_name(metrics: list[tuple[str, str, float]]) -> dict[str, tuple[float, str]]:
    """{display name: (value, unit)}; a percentage wins over a later metric of the same name in another unit
    (ncu reuses 'Memory Throughput' for % in Speed Of Light and Gbyte/s in Memory Workload Analysis)."""
    out: dict[str, tuple[float, str]] = {}
    for name, unit, value in metrics:
        if name in out and (out[name][1] == "%" or unit != "%"):
            continue
        out[name] = (value, unit)
    return out


def _metric_dict(metrics: list[tuple[str, str, float]]) -> dict[str, float]:
    """NcuKernel.metrics: values by display name, plus 'Duration [us]' as KForge's own collector names it."""
    out = {name: value for name, (value, _) in _by_name(metrics).items()}
    if (duration := _duration_us(metrics)) is not None:
        out["Duration [us]"] = duration
    return out


def _report(launches: _Launches, rules: _Rules, cc: str | None) -> ProfileReport:
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
    counters = [Counter(name=n, unit=u, value=v) for n, (v, u) in _by_name(launches[top_key]).items()]
    counters += [Counter(name=f"{n} [{_short(kernel)}]", unit=u, value=v)
                 for (lid, kernel), metrics in launches.items() if (lid, kernel) != top_key
                 for n, u, v in metrics]
    # Every launch as ncu saw it, the top one first, so rules over ncu's findings read pasted text too.
    order = [top_key] + [k for k in launches if k != top_key]
    kernels = tuple(NcuKernel(name=kernel, is_custom=True, metrics=_metric_dict(launches[(lid, kernel)]),
                              rules=rules.get((lid, kernel), [])) for lid, kernel in order)
    notes = [_PASTED_NOTE, "ncu cannot tell the candidate's kernels from framework kernels: custom share unknown"]
    if not ops:
        notes.append("no 'Duration' metric in the ncu output: kernel times are unknown")
    return ProfileReport(backend="cuda", device_name=f"GPU (compute capability {cc})" if cc else "GPU (from ncu)",
                         collector="ncu", ops=tuple(ops), counters=tuple(counters), ncu=kernels, notes=tuple(notes))
