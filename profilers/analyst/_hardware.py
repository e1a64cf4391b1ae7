"""Hardware-counter rules: perf (IPC, cache miss rate) and Nsight Compute (speed-of-light percentages).

Each rule may claim memory-, compute- or latency-bound. ncu measures one kernel directly, so its
claims outrank perf's, which count the whole worker process (framework code included).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kforge.profilers.report import NcuKernel, ProfileReport, hottest_kernel

from .base import Evidence

__all__ = ["Claim", "HardwareFindings", "classify", "uncoalesced"]

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

# A kernel shorter than this per launch runs for less time than launching it costs on the host
# (cudaLaunchKernel takes ~2-5 us), so the GPU mostly waits for launches.
TINY_KERNEL_US = 5.0
# ncu reports "only N of the 32 bytes transmitted per sector are utilized": a quarter or less is a
# strided pattern, not a partial tail.
UNCOALESCED_BYTES_PER_SECTOR = 8.0
# Sectors per warp request: 4 is a coalesced fp32 access, 16 a coalesced 16-byte (float4) one; more
# than any vector width gives means threads hit different sectors.
UNCOALESCED_SECTORS_PER_REQUEST = 24.0

# Above this fraction of the measured copy bandwidth a DRAM-bound kernel has little left to gain.
BANDWIDTH_CEILING_FRACTION = 0.8

# Claim priorities (lower wins); structural claims in rules.py use 0-2.
PRIORITY_NCU_LAUNCH, PRIORITY_NCU, PRIORITY_PERF = 3, 4, 5

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
    remedy: str | None = None  # key of the remedy text when it is more specific than the bottleneck


@dataclass
class HardwareFindings:
    claims: list[Claim] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def classify(report: ProfileReport) -> HardwareFindings:
    """Run the ncu and perf rules over `report.counters`."""
    out = HardwareFindings()
    if report.counters_note:
        out.notes.append(f"hardware counters unavailable: {_one_line(report.counters_note)}")
    _ncu(report, out)
    _perf(report, out)
    return out


# One row of `perf stat -x ,`: value (or <not supported>/<not counted>), unit, event (with a modifier such as ':u'), ...
_PERF_ROW = re.compile(r"(?:^|\s)(?P<value><[^>\n]+>|[\d.]+),[^,\n]*,(?P<event>[\w./-]+)(?::\w+)?,", re.M)


def _one_line(note: str) -> str:
    """The collector's note in one line: perf's CSV rows become which events it could not count, and why in its words."""
    rows = list(_PERF_ROW.finditer(note))
    if not rows:
        return " ".join(note.split())
    missing: dict[str, list[str]] = {}
    counted = []
    for row in rows:
        event, value = row.group("event"), row.group("value")
        if value.startswith("<"):
            missing.setdefault(value, []).append(event)
        else:
            counted.append(event)
    said = "; ".join(f"perf reported {', '.join(events)} as {reason}" for reason, events in missing.items())
    if missing and "<not supported>" in missing:
        said += " (this host exposes no hardware PMU events to perf: usual in a virtual machine)"
    if counted:
        said += f"{'; ' if said else 'perf '}counted only {', '.join(counted)}" + (" (a software event)" if counted == [
            "task-clock"] else "")
    return said


def _first(values: dict[str, float], names: tuple[str, ...]) -> tuple[str, float] | None:
    return next(((n, values[n]) for n in names if n in values), None)


_BYTES_USED = re.compile(r"only ([\d.]+) of the 32 bytes transmitted per sector are utilized")
_EXCESSIVE = re.compile(r"uncoalesced global accesses resulting in a total of (\d+) excessive sectors \((\d+)% of")


def uncoalesced(kernel: NcuKernel | None) -> list[Evidence]:
    """Evidence that the kernel's global accesses are strided (empty when they are not)."""
    if kernel is None:
        return []
    ev = []
    for r in kernel.rules:
        message = r.get("message", "")
        if m := _EXCESSIVE.search(message):
            ev.append(Evidence(metric="excessive sectors (uncoalesced)", value=f"{m.group(2)}% of all sectors",
                               judged_against="0% when consecutive threads read consecutive addresses",
                               source="ncu rule " + (r.get("rule") or "UncoalescedGlobalAccess")))
        elif (m := _BYTES_USED.search(message)) and float(m.group(1)) <= UNCOALESCED_BYTES_PER_SECTOR:
            ev.append(Evidence(metric="bytes used per 32-byte sector", value=float(m.group(1)),
                               judged_against=f"<= {UNCOALESCED_BYTES_PER_SECTOR:g} is a strided access",
                               source="ncu rule " + (r.get("rule") or "MemoryCacheAccessPattern")))
    for name in ("Global Load Sectors Per Request", "Global Store Sectors Per Request"):
        value = kernel.metrics.get(name)
        if value is not None and value >= UNCOALESCED_SECTORS_PER_REQUEST:
            ev.append(Evidence(metric=name, value=value, judged_against=f"4 (fp32) to 16 (float4) when coalesced, "
                               f">= {UNCOALESCED_SECTORS_PER_REQUEST:g} strided", source="ncu"))
    return ev


def _memory_kind(values: dict[str, float], kernel: NcuKernel | None) -> tuple[str, str, list[Evidence]]:
    """(remedy key, words for the why, evidence) for a memory-bound kernel: strided, cache-bound or DRAM-bound."""
    if ev := uncoalesced(kernel):
        return "memory-bound:uncoalesced", "; its global accesses are uncoalesced (" + ", ".join(
            f"{e.metric} {e.value}" for e in ev) + ")", ev
    dram = values.get("DRAM Throughput")
    caches = [(n, values[n]) for n in ("L1/TEX Cache Throughput", "L2 Cache Throughput") if n in values]
    busiest = max(caches, key=lambda c: c[1], default=None)
    if dram is not None and dram < NCU_LOW_PCT and busiest and busiest[1] > NCU_HIGH_PCT:
        ev = [Evidence(metric=busiest[0], value=busiest[1], judged_against=f"> {NCU_HIGH_PCT:g}% busy", source="ncu"),
              Evidence(metric="DRAM Throughput", value=dram, judged_against=f"< {NCU_LOW_PCT:g}%: data comes from cache",
                       source="ncu")]
        return "memory-bound:cache", (f"; the traffic is in {busiest[0].split(' Cache')[0]} ({busiest[1]:.0f}%), not DRAM "
                                      f"({dram:.0f}%): the kernel re-reads the same data from cache"), ev
    return "memory-bound", "", []


def _at_bandwidth_ceiling(report: ProfileReport, values: dict[str, float]) -> tuple[str, str, list[Evidence]] | None:
    """The DRAM-bound kernel already moves data near the device's bandwidth: by the timed bytes against the
    measured copy rate (profile_kernel), or by ncu's DRAM throughput against the theoretical peak (pasted ncu)."""
    fraction, dram = report.bandwidth_fraction, values.get("DRAM Throughput")
    if fraction is not None and fraction >= BANDWIDTH_CEILING_FRACTION:
        ev = Evidence(metric="bandwidth_fraction", value=round(fraction, 4),
                      judged_against=f">= {BANDWIDTH_CEILING_FRACTION:g} of the measured device copy rate", source="timing")
        said = f"{100 * fraction:.0f}% of the device's measured bandwidth"
    elif dram is not None and dram >= 100 * BANDWIDTH_CEILING_FRACTION:
        ev = Evidence(metric="DRAM Throughput", value=dram,
                      judged_against=f">= {100 * BANDWIDTH_CEILING_FRACTION:g}% of peak", source="ncu")
        said = f"{dram:.0f}% of the DRAM's peak"
    else:
        return None
    return ("memory-bound:at-ceiling", f"; it already moves its data at {said}, so only moving fewer bytes makes it "
            "faster", [ev])


def _ncu(report: ProfileReport, out: HardwareFindings) -> None:
    values = {c.name: c.value for c in report.counters}
    hot = hottest_kernel(report.ncu)
    duration = hot.metrics.get("Duration [us]") if hot else values.get("Duration [us]")
    if duration is not None and 0 < duration < TINY_KERNEL_US:
        ev = Evidence(metric="kernel duration [us]", value=duration,
                      judged_against=f"< {TINY_KERNEL_US:g} us, about what one launch costs on the host", source="ncu")
        out.evidence.append(ev)
        why = (f"the hot kernel runs {duration:.2f} us per launch, less than launching it costs (a few us of host "
               "time), so the GPU mostly waits for launches")
        out.claims.append(Claim("launch-bound", PRIORITY_NCU_LAUNCH, why, [ev], "medium", "launch-bound:tiny-kernels"))
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
        remedy, detail, kind_ev = _memory_kind(values, hot)
        if remedy == "memory-bound" and (ceiling := _at_bandwidth_ceiling(report, values)):
            remedy, detail, kind_ev = ceiling
        why = f"{memory[0]} is {mem_pct:.0f}% of peak" + (f" while compute is {comp_pct:.0f}%" if comp_pct is not None else "")
        out.evidence.extend(e for e in kind_ev if e not in out.evidence)
        out.claims.append(Claim("memory-bound", PRIORITY_NCU, why + detail, ev + kind_ev, remedy=remedy))
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
