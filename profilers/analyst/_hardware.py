"""Hardware-counter rules: perf (IPC, cache miss rate) and Nsight Compute (speed-of-light percentages).

Each rule may claim memory-, compute- or latency-bound. ncu measures one kernel directly, so its
claims outrank perf's, which count the whole worker process (framework code included).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kforge.profilers.report import ProfileReport

from .base import Evidence

__all__ = ["Claim", "HardwareFindings", "classify"]

# Below one instruction per cycle an out-of-order core spends most cycles stalled.
LOW_IPC = 1.0
# Above two per cycle the core is busy executing: the arithmetic itself is the cost.
HIGH_IPC = 2.0
# perf's cache-references/misses count last-level-cache traffic: a fifth missing means DRAM serves much of it.
HIGH_MISS_RATE = 0.20
# ncu speed-of-light: above 60% of peak a unit is the one limiting the kernel.
NCU_HIGH_PCT = 60.0
# ncu speed-of-light: both units under 40% means neither is busy; the kernel waits (latency).
NCU_LOW_PCT = 40.0

# Claim priorities (lower wins); structural claims in rules.py use 0-2.
PRIORITY_NCU, PRIORITY_PERF = 3, 4

# Metric names across ncu versions (2019-2021 used the bracketed forms).
_NCU_MEMORY = ("DRAM Throughput", "Memory Throughput", "Memory [%]")
_NCU_COMPUTE = ("Compute (SM) Throughput", "Compute (SM) [%]", "SM [%]")
# perf event names vary by kernel and CPU (hybrid cores prefix 'cpu_core/').
_PERF_ALIASES = {"cpu-cycles": "cycles", "cpu_core/cycles/": "cycles", "cpu_core/instructions/": "instructions",
                 "cpu_core/cache-misses/": "cache-misses", "cpu_core/cache-references/": "cache-references"}


@dataclass
class Claim:
    """A rule's vote for a bottleneck: lower priority wins; `why` becomes `Analysis.bottleneck_why`."""

    bottleneck: str
    priority: int
    why: str
    evidence: list[Evidence]
    confidence: str = "high"


@dataclass
class HardwareFindings:
    claims: list[Claim] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def classify(report: ProfileReport) -> HardwareFindings:
    """Run the ncu and perf rules over `report.counters`."""
    out = HardwareFindings()
    if report.counters_note:
        out.notes.append(f"hardware counters unavailable: {report.counters_note}")
    _ncu(report, out)
    _perf(report, out)
    return out


def _first(values: dict[str, float], names: tuple[str, ...]) -> tuple[str, float] | None:
    return next(((n, values[n]) for n in names if n in values), None)


def _ncu(report: ProfileReport, out: HardwareFindings) -> None:
    values = {c.name: c.value for c in report.counters}
    memories = [(n, values[n]) for n in _NCU_MEMORY if n in values]
    memory = max(memories, key=lambda m: m[1]) if memories else None  # DRAM or L1/L2: the busier one limits
    compute = _first(values, _NCU_COMPUTE)
    if memory is None and compute is None:
        return
    ev = [Evidence(metric=n, value=v, judged_against=f"> {NCU_HIGH_PCT:g}% busy, < {NCU_LOW_PCT:g}% idle",
                   source="ncu") for n, v in [m for m in (memory, compute) if m is not None]]
    occupancy = _first(values, ("Achieved Occupancy",))
    theoretical = _first(values, ("Theoretical Occupancy",))
    if occupancy:
        ev.append(Evidence(metric="Achieved Occupancy", value=occupancy[1],
                           judged_against=f"Theoretical Occupancy {theoretical[1]:g}%" if theoretical else None,
                           source="ncu"))
    out.evidence.extend(ev)
    mem_pct = memory[1] if memory else None
    comp_pct = compute[1] if compute else None
    if mem_pct is not None and mem_pct > NCU_HIGH_PCT and (comp_pct is None or comp_pct < mem_pct):
        why = f"{memory[0]} is {mem_pct:.0f}% of peak" + (f" while compute is {comp_pct:.0f}%" if comp_pct is not None else "")
        out.claims.append(Claim("memory-bound", PRIORITY_NCU, why, ev))
    elif comp_pct is not None and comp_pct > NCU_HIGH_PCT:
        why = f"{compute[0]} is {comp_pct:.0f}% of peak" + (f" while memory is {mem_pct:.0f}%" if mem_pct is not None else "")
        out.claims.append(Claim("compute-bound", PRIORITY_NCU, why, ev))
    elif mem_pct is not None and comp_pct is not None and mem_pct < NCU_LOW_PCT and comp_pct < NCU_LOW_PCT:
        why = f"neither memory ({mem_pct:.0f}%) nor compute ({comp_pct:.0f}%) is busy: the kernel waits on latency"
        if occupancy:
            why += f"; achieved occupancy is {occupancy[1]:.0f}%"
            why += f" of a theoretical {theoretical[1]:.0f}%" if theoretical else ""
        waves = values.get("Waves Per SM")
        if waves is not None and waves < 1:  # fewer blocks than the SMs can hold at once
            why += f"; the grid fills {waves:.2f} of one wave over the SMs, so launch more blocks"
            ev.append(Evidence(metric="Waves Per SM", value=waves, judged_against=">= 1 (one full wave)", source="ncu"))
        out.claims.append(Claim("latency-bound", PRIORITY_NCU, why, ev))
    else:
        out.notes.append(f"ncu: memory and compute are both between {NCU_LOW_PCT:g}% and {NCU_HIGH_PCT:g}% of peak; "
                         "no single unit limits the kernel")


def _perf(report: ProfileReport, out: HardwareFindings) -> None:
    values = {_PERF_ALIASES.get(c.name, c.name): c.value for c in report.counters}
    cycles, instructions = values.get("cycles", 0.0), values.get("instructions", 0.0)
    if cycles <= 0 or instructions <= 0:
        return
    ipc = instructions / cycles
    refs = values.get("cache-references", 0.0)
    miss_rate = values.get("cache-misses", 0.0) / refs if refs > 0 else None
    ev = [Evidence(metric="IPC", value=round(ipc, 3), judged_against=f"< {LOW_IPC:g} stalled, > {HIGH_IPC:g} busy",
                   source="perf")]
    if miss_rate is not None:
        ev.append(Evidence(metric="cache miss rate", value=round(miss_rate, 4), judged_against=f"> {HIGH_MISS_RATE}",
                           source="perf"))
    out.evidence.extend(ev)
    scope = "perf counts the whole worker process, framework code included"
    if ipc < LOW_IPC and miss_rate is not None and miss_rate > HIGH_MISS_RATE:
        why = f"IPC {ipc:.2f} with {100 * miss_rate:.0f}% of cache references missing: the core waits on memory ({scope})"
        out.claims.append(Claim("memory-bound", PRIORITY_PERF, why, ev, "medium"))
    elif ipc < LOW_IPC:
        why = f"IPC {ipc:.2f} without many cache misses: dependency chains or branches stall the core ({scope})"
        out.claims.append(Claim("latency-bound", PRIORITY_PERF, why, ev, "low"))
    elif ipc > HIGH_IPC:
        why = f"IPC {ipc:.2f}: the core retires instructions quickly, so the work itself is the cost ({scope})"
        out.claims.append(Claim("compute-bound", PRIORITY_PERF, why, ev, "medium"))
