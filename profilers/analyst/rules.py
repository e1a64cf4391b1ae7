"""The built-in analyst: offline, deterministic rules over a `ProfileReport`.

Algorithm:
  1. Structural and hardware rules run first; each may claim a bottleneck with a priority and
     propose recommendations. Structure outranks hardware: when most time is in framework ops,
     counters describe PyTorch's kernels rather than the candidate's, so "framework-bound" wins
     over what perf or ncu say. Order: framework-bound, launch-bound, host-bound, ncu class,
     perf class; nothing claimed -> "unknown" with a note on the missing data.
  2. Rules that depend on the verdict run next: the speed comparison against eager and
     torch.compile, and backend-specific remedies for the hottest kernel (texts in `_remedies.py`).
  3. Noisy timing lowers the confidence of speed-based recommendations by one level.
  4. Recommendations are ranked by confidence, then by the share of time they affect, then by
     title, so the same report always gives the same ranking.
"""

from __future__ import annotations

from kforge.profilers.compiler_report import CompilerFacts
from kforge.profilers.report import OpRow, ProfileReport, host_issued
from kforge.profilers.torch_profiler import CUSTOM_PREFIX

from . import _hardware
from ._findings import (CONFIDENCE_WEIGHT, ROOFLINE_BANDWIDTH, ROOFLINE_COMPUTE, UNCONFIRMED_WEIGHT, Draft as _Draft,
                        Findings as _Findings, roofline_evidence)
from ._compare import describe_changes, locate_definition
from ._remedies import MATMUL_REMEDIES, REMEDIES, REMEDY_TITLES, SLOWER_THAN_EAGER, family_of, is_matmul_like
from .base import Analysis, Bottleneck, Evidence, Recommendation
from .code_rules import code_findings
from .redundant import Present, already_present, fully_fused, prune
from .source import read_source
from .text import parse_profile_text

__all__ = ["RulesAnalyst"]

# Below half of op time in the candidate's own kernels, the framework, not the candidate, sets the speed.
CUSTOM_SHARE_MIN = 0.5
# Below a quarter the framework verdict is clear enough to state with high confidence.
CUSTOM_SHARE_CLEAR = 0.25
# An op this short (mean self time per call) costs about as much in dispatch/launch overhead as in work.
SMALL_OP_MEAN_US = 10.0
# More op invocations than this per forward call leave clear fusion headroom.
MANY_OPS_PER_CALL = 8.0
# Small ops must hold at least this share of op time before overhead is the bottleneck.
LAUNCH_SHARE_MIN = 0.5
# Allocation and copy ops above a tenth of op time are worth removing.
ALLOC_COPY_SHARE_MIN = 0.10
# IQR / median above this makes a timing noisy (the same 10% PyTorch's benchmark utils warn at).
NOISE_IQR_FRACTION = 0.10
# A device busy for less than half of the candidate's wall time is waiting on the host.
DEVICE_BUSY_MIN = 0.5
# Cap on recommendations: the agent acts on the first few; the rest are noise.
MAX_RECOMMENDATIONS = 6

# Allocation and copy ops, by exact name or prefix ('aten::empty' covers empty_like, empty_strided).
_ALLOC_COPY_PREFIXES = ("aten::empty", "aten::zeros", "aten::zero_", "aten::copy_", "aten::contiguous",
                        "aten::clone", "aten::to", "aten::_to_copy")
_CONFIDENCE_ORDER = {"high": 0, "medium": 1, "low": 2}
_LOWER = {"high": "medium", "medium": "low", "low": "low"}
# Claim priorities (lower wins); hardware classes come from `_hardware`.
_PRIORITY_FRAMEWORK, _PRIORITY_LAUNCH, _PRIORITY_HOST = 0, 1, 2


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def _op_list(rows: list[OpRow], n: int = 3) -> str:
    return ", ".join(f"{r.name} ({_pct(r.share)})" for r in rows[:n])


def _by_share(rows: list[OpRow] | tuple[OpRow, ...]) -> list[OpRow]:
    return sorted(rows, key=lambda r: (-r.share, r.name))


def _rule_custom_share(report: ProfileReport, out: _Findings) -> None:
    """Framework-bound when the candidate's own kernels hold less than half of op time (or none at all)."""
    share = report.custom_share
    if share is None or not report.ops:
        return
    custom = [r for r in report.ops if r.is_custom]
    others = _by_share([r for r in report.ops if not r.is_custom])
    ev = Evidence(metric="custom_share", value=share, judged_against=f">= {CUSTOM_SHARE_MIN} (half of op time)",
                  source=report.collector)
    out.evidence.append(ev)
    if share >= CUSTOM_SHARE_MIN or not others:
        return
    family = family_of(report)
    if not custom:
        why = f"the candidate calls no kernel of its own: all profiled op time is in framework ops ({_op_list(others)})"
        out.claims.append(_hardware.Claim("framework-bound", _PRIORITY_FRAMEWORK, why, [ev]))
        out.drafts.append(_Draft(
            "Write and call your own kernel", f"Implement the computation as a custom kernel and call it from "
            f"ModelNew.forward; the framework ops to replace first: {_op_list(others)}. {REMEDIES[family]['framework-bound']}",
            others[0].name, why, "the speedup can only come from your kernel; today there is none",
            "high", [ev], 1.0))
        return
    why = f"the candidate's own kernels take {_pct(share)} of op time; most is in framework ops ({_op_list(others)})"
    out.claims.append(_hardware.Claim("framework-bound", _PRIORITY_FRAMEWORK, why, [ev]))
    out.drafts.append(_Draft(
        f"Move {others[0].name} into your kernel",
        f"Fuse the framework ops around your kernel into it: {_op_list(others)}. {REMEDIES[family]['framework-bound']}",
        others[0].name, why, f"up to {_pct(1 - share)} of op time moves into your kernel or disappears",
        "high" if share < CUSTOM_SHARE_CLEAR else "medium", [ev], 1 - share))


def _rule_framework_inside(report: ProfileReport, out: _Findings) -> None:
    """Framework-bound inside the candidate's own ranges: they mostly call at:: ops (CPU reports).

    A `kforge::` range's self time is the extension's own code; its total adds the framework ops
    it dispatched. On GPU the candidate's own kernels are children of the range too, so this
    rule would misread them and runs only for CPU reports.
    """
    custom = _by_share([r for r in report.ops if r.is_custom])
    share = report.custom_share
    if not custom or share is None or share < CUSTOM_SHARE_MIN:
        return
    if family_of(report) != "cpu":
        return
    own = sum(r.share for r in custom)
    ev = Evidence(metric="own_code_share", value=round(own, 4),
                  judged_against=f">= {CUSTOM_SHARE_MIN} (self time of your ranges, without the ops they call)",
                  source=report.collector)
    out.evidence.append(ev)
    if own >= CUSTOM_SHARE_MIN:
        return
    others = _by_share([r for r in report.ops if not r.is_custom])
    why = (f"your ranges hold {_pct(share)} of op time, but your own code only {_pct(own)}: the rest is framework "
           f"ops called from inside them (likely {_op_list(others)})")
    out.claims.append(_hardware.Claim("framework-bound", _PRIORITY_FRAMEWORK, why, [ev], "medium"))
    out.drafts.append(_Draft(
        f"Replace the at:: calls inside {custom[0].name}",
        f"Inside {custom[0].name}, write the loops yourself instead of calling at:: / torch:: ops "
        f"(likely {_op_list(others)}), and fuse them into one pass over the data.",
        custom[0].name, why, f"up to {_pct(share - own)} of op time becomes your own fused code", "medium",
        [ev], share - own))


# Rows of the profiler's own bookkeeping and of synchronization: not the candidate's ops.
_BOOKKEEPING = ("Activity Buffer Request", "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
                "ProfilerStep")
# Host-side kernel launch calls, as torch.profiler names them.
_LAUNCH_APIS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "hipLaunchKernel")


def _counted_ops(report: ProfileReport, gpu: bool) -> list[OpRow]:
    """Rows that are ops of the forward: no bookkeeping, and on a GPU no labelled ranges (they repeat their kernels)."""
    return [r for r in report.ops if not r.name.startswith(_BOOKKEEPING)
            and not (gpu and r.name.startswith(CUSTOM_PREFIX)) and r.name not in _LAUNCH_APIS]


def _ops_per_call(ops: list[OpRow], profiled_calls: int) -> tuple[float, bool]:
    """(op invocations per forward call, whether it is measured rather than estimated)."""
    total = sum(r.calls for r in ops)
    if profiled_calls > 0:
        return total / profiled_calls, True
    # Unknown call count (pasted text): assume the least-called op runs once per call, a lower bound.
    fewest = min((r.calls for r in ops if r.calls > 0), default=0)
    return (total / fewest if fewest else 0.0), False


def _rule_launch(report: ProfileReport, out: _Findings) -> None:
    """Launch-bound when many short ops per call hold most of the time, or launching kernels takes the
    host longer than the kernels run."""
    gpu = family_of(report) == "gpu"
    ops = _counted_ops(report, gpu)
    # On GPU a kernel row's cost is its device time; host-only rows (launch calls) keep their CPU time.
    small = _by_share([r for r in ops if r.calls > 0 and
                       ((r.device_time_us if gpu and r.device_time_us else r.self_time_us) / r.calls) < SMALL_OP_MEAN_US])
    per_call, measured = _ops_per_call(ops, report.profiled_calls)
    launches = bool(gpu and report.launches_per_call)  # counted over every device event, not the table's top rows
    if launches:  # the ones the host issued: a CUDA graph's replay is one launch for all its kernels
        per_call, measured = host_issued(report.launches_per_call, report.host_launches_per_call), True
    calls = "kernel launches" if launches else "op calls"
    small_share = sum(r.share for r in small)
    launch_us = sum(r.self_time_us for r in report.ops if r.name in _LAUNCH_APIS)
    kernel_us = sum(r.device_time_us or 0.0 for r in ops)
    timed_us = report.candidate.median_us if report.candidate is not None else None
    if not small and not launch_us and not (measured and timed_us and per_call >= MANY_OPS_PER_CALL
                                            and timed_us / per_call < SMALL_OP_MEAN_US):
        return
    ev = [Evidence(metric="ops_per_call" if measured else "ops_per_call (lower bound)", value=round(per_call, 2),
                   judged_against=f">= {MANY_OPS_PER_CALL:g}", source=report.collector),
          Evidence(metric="small_op_share", value=round(small_share, 4),
                   judged_against=f">= {LAUNCH_SHARE_MIN} in ops under {SMALL_OP_MEAN_US:g} us per call",
                   source=report.collector)]
    if launch_us and kernel_us:
        ev.append(Evidence(metric="host launch time / kernel time", value=round(launch_us / kernel_us, 3),
                           judged_against=">= 1: the host cannot launch kernels as fast as they finish",
                           source=report.collector))
    out.evidence.extend(ev)
    many_small = per_call >= MANY_OPS_PER_CALL and small_share >= LAUNCH_SHARE_MIN
    launch_heavy = kernel_us > 0 and launch_us >= kernel_us
    # The profiler inflates short ops (its own overhead per op); the timed call, split over its ops, does not.
    timed_per_op = report.candidate.median_us / per_call if report.candidate is not None and per_call else None
    timed_small = (measured and per_call >= MANY_OPS_PER_CALL and timed_per_op is not None
                   and timed_per_op < SMALL_OP_MEAN_US)
    if timed_small and not many_small:
        ev.append(Evidence(metric="timed us per op call", value=round(timed_per_op, 3),
                           judged_against=f"< {SMALL_OP_MEAN_US:g} us: dispatch overhead, not work", source="timing"))
        out.evidence.append(ev[-1])
    if not (many_small or launch_heavy or timed_small):
        return
    family = "gpu" if gpu else "cpu"
    if timed_small and not many_small:
        why = (f"{per_call:.0f} {calls} per forward in a {report.candidate.median_us:.0f} us call: {timed_per_op:.1f} us "
               "each, about what dispatching an op costs, so overhead, not work, sets the time")
        small_share = 1.0
    elif many_small:
        why = (f"{per_call:.0f} {calls} per forward{'' if measured else ' (at least)'}, and ops averaging under "
               f"{SMALL_OP_MEAN_US:g} us hold {_pct(min(1.0, small_share))} of op time: overhead, not work")
    else:
        why = (f"launching the kernels took {launch_us:.0f} us of host time, more than the {kernel_us:.0f} us they ran "
               "on the device: the GPU waits for launches")
    out.claims.append(_hardware.Claim("launch-bound", _PRIORITY_LAUNCH, why, ev))
    targets = _by_share(ops) if timed_small and not many_small else (small or _by_share(ops))
    affected = min(1.0, small_share or 1.0)  # launch-heavy without small ops: the whole window is overhead
    out.drafts.append(_Draft(
        "Fuse the small ops into one kernel", f"{REMEDIES[family]['launch-bound']} Start with {_op_list(targets)}; "
        "avoid per-call allocations (aten::empty/zeros) and .contiguous() copies inside the loop.",
        targets[0].name if targets else None, why, f"most of {_pct(affected)} of op time, which is per-op overhead",
        "high" if measured or launch_heavy else "medium", ev, affected))


def _rule_alloc_copy(report: ProfileReport, out: _Findings) -> None:
    """Allocation and copy ops with a notable share: preallocate, drop copies."""
    rows = _by_share([r for r in report.ops if r.name.startswith(_ALLOC_COPY_PREFIXES)])
    share = sum(r.share for r in rows)
    if not rows or share < ALLOC_COPY_SHARE_MIN:
        return
    ev = [Evidence(metric="alloc_copy_share", value=round(share, 4), judged_against=f">= {ALLOC_COPY_SHARE_MIN}",
                   source=report.collector)]
    ev += [Evidence(metric=f"op:{r.name} share", value=round(r.share, 4), judged_against=None, source=report.collector)
           for r in rows[:3]]
    out.evidence.extend(ev)
    out.drafts.append(_Draft(
        "Preallocate outputs and drop copies",
        "Allocate outputs once (or use at::empty rather than at::zeros when every element is written), and drop "
        ".contiguous()/.clone()/.to() on tensors that already have the right layout and dtype. A Python scalar in "
        "an elementwise op (x * 1.5) also shows up as aten::to/_to_copy; that copy disappears once the op is fused "
        f"into your kernel. Ops involved: {_op_list(rows)}.",
        rows[0].name, f"allocation and copy ops take {_pct(share)} of op time ({_op_list(rows)})",
        f"up to {_pct(share)} of op time", "medium", ev, share))


def _rule_host(report: ProfileReport, out: _Findings) -> None:
    """Host-bound when the device is busy for under half of the candidate's wall time (GPU reports)."""
    device_us = sum(r.device_time_us or 0.0 for r in report.ops)
    if report.candidate is None or report.profiled_calls <= 0 or device_us <= 0:
        return
    busy = device_us / report.profiled_calls / report.candidate.median_us
    ev = Evidence(metric="device_busy_fraction", value=round(busy, 4), judged_against=f">= {DEVICE_BUSY_MIN}",
                  source=report.collector)
    out.evidence.append(ev)
    if busy >= DEVICE_BUSY_MIN:
        return
    why = f"the device is busy for {_pct(busy)} of each call; the rest of the time it waits on the host"
    out.claims.append(_hardware.Claim("host-bound", _PRIORITY_HOST, why, [ev]))
    out.drafts.append(_Draft("Cut host-side work between kernels", REMEDIES["gpu"]["host-bound"], None, why,
                             f"up to {_pct(1 - busy)} of wall time", "medium", [ev], 1 - busy))


def _rule_speed(report: ProfileReport, bottleneck: Bottleneck, out: _Findings) -> None:
    """Compare with eager and torch.compile; name the direction when the candidate is slower."""
    for b in report.baselines:
        if b.error:
            out.notes.append(f"{b.name} baseline not timed: {b.error}")
    speed = {b.name: b.speedup for b in report.baselines if b.speedup is not None}
    ev = {name: Evidence(metric=f"speedup_vs_{name}", value=s, judged_against=">= 1 (faster than the baseline)",
                         source="timing") for name, s in speed.items()}
    out.evidence.extend(ev.values())
    eager, compiled = speed.get("eager"), speed.get("torch.compile")
    if eager is not None and eager < 1:
        why = f"the candidate takes x{1 / eager:.2f} the time of eager PyTorch"
        out.drafts.append(_Draft(
            "Get faster than eager first", SLOWER_THAN_EAGER[bottleneck], None, why,
            f"reach at least eager's speed: -{_pct(1 - eager)} of the candidate's time", "high",
            list(ev.values()), 1 - eager, speed_based=True, generic=True))
    elif compiled is not None and compiled < 1:
        if fully_fused(report):
            title = "Close the gap to torch.compile inside your kernel"
            why = (f"torch.compile's version is x{1 / compiled:.2f} faster, and the candidate already does the whole "
                   "forward in one kernel: the gap is the kernel's own code, not fusion")
            action = ("Compare your kernel's loops with the code inductor generates for the reference (TORCH_LOGS=output_code): "
                      "its loop order, tiling, vectorization and math functions show what makes the same work faster.")
        else:
            title = "Fuse as much as torch.compile does"
            why = (f"torch.compile's fused version is x{1 / compiled:.2f} faster than the candidate"
                   + (f", which already beats eager (x{eager:.2f})" if eager is not None else ""))
            action = ("torch.compile's fusion shows the headroom: fuse the same ops into your kernel so data makes one "
                      "pass through memory. Run the reference under TORCH_LOGS=output_code to see which ops inductor fused.")
        out.drafts.append(_Draft(title, action, None, why, f"up to {_pct(1 - compiled)} of the candidate's time",
                                 "medium", list(ev.values()), 1 - compiled, speed_based=True, generic=True))


def _rule_hot_kernel(report: ProfileReport, bottleneck: Bottleneck, remedy: str, confidence: str, out: _Findings) -> None:
    """Backend remedies for the hottest kernel once the kernel itself is the bottleneck.

    `remedy` is the bottleneck or a more specific kind of it ('memory-bound:uncoalesced'); a family
    without a text for the specific kind gets the bottleneck's.
    """
    if remedy not in REMEDY_TITLES or not report.ops:
        return
    custom = _by_share([r for r in report.ops if r.is_custom])
    if not custom and report.custom_share is not None:
        return  # the candidate has no kernel to tune; the framework rule speaks
    hot = custom[0] if custom else _by_share(report.ops)[0]
    affected = report.custom_share if custom and report.custom_share is not None else hot.share
    family = family_of(report)
    key = remedy if remedy in REMEDIES[family] else bottleneck
    action = REMEDIES[family][key]
    if is_matmul_like(hot.name):
        action += " " + MATMUL_REMEDIES[family]
    ev = Evidence(metric=f"op:{hot.name} share", value=round(affected, 4), judged_against=None,
                  source=report.collector)
    why = f"{hot.name} holds {_pct(affected)} of op time" + (
        "; without hardware counters this advice is generic" if bottleneck == "unknown" else f" and is {bottleneck}")
    out.drafts.append(_Draft(REMEDY_TITLES[key], action, hot.name, why,
                             f"a faster {hot.name} speeds up {_pct(affected)} of op time", confidence, [ev], affected,
                             generic=True))


def _rule_noise(report: ProfileReport, out: _Findings) -> None:
    """Note noisy timings and lower the confidence of speed-based recommendations."""
    timings = [t for t in [report.candidate, *(b.timing for b in report.baselines)] if t is not None]
    noisy = []
    for t in timings:
        spread = t.iqr_us / t.median_us if t.median_us > 0 else 0.0
        if t.label == "candidate":
            out.evidence.append(Evidence(metric="iqr/median", value=round(spread, 4),
                                         judged_against=f"<= {NOISE_IQR_FRACTION}", source="timing"))
        if spread > NOISE_IQR_FRACTION or (t.label == "candidate" and t.warnings):
            noisy.append(f"{t.label}: {'; '.join(t.warnings) or f'IQR is {_pct(spread)} of the median'}")
    if not noisy:
        return
    out.notes.append("timing is noisy, so speed-based confidence was lowered (" + " | ".join(noisy) + ")")
    for d in out.drafts:
        if d.speed_based:
            d.confidence = _LOWER[d.confidence]


def _order(drafts: list[_Draft]) -> list[_Draft]:
    """By expected effect: the share of time a change should save, weighted by how sure the rule is."""
    return sorted(drafts, key=lambda d: (-round(d.expected_gain * CONFIDENCE_WEIGHT[d.confidence], 6),
                                         _CONFIDENCE_ORDER[d.confidence], d.title, d.where or ""))


def _weigh_by_class(out: _Findings, bottleneck: Bottleneck) -> None:
    """A change that pays only in one class (wider vectors: compute-bound loops) counts for less where the analysis
    found another class or none; a change in the code's structure ranks ahead of it then."""
    for d in out.drafts:
        if d.needs and d.needs != bottleneck:
            d.gain = d.expected_gain * UNCONFIRMED_WEIGHT
            d.expected_effect += (f"; nothing measured says the loops are {d.needs}" if bottleneck == "unknown" else
                                  f"; less where the candidate is {bottleneck}")


def _unclassified_why(report: ProfileReport, out: _Findings, family: str) -> str:
    """Why no class was found, in what the evidence does show: the roofline's fractions (or why a class the code
    suggests was withheld), the code's main finding, and the measurement that would decide."""
    parts = list(out.withheld)
    if not parts and report.bandwidth_fraction is not None:
        parts.append(f"the timed call moves its inputs and outputs at {_pct(report.bandwidth_fraction)} of the measured "
                     f"copy bandwidth (the ceiling is {_pct(ROOFLINE_BANDWIDTH)})"
                     + (f" and computes at {_pct(report.compute_fraction)} of the measured matmul rate (the ceiling is "
                        f"{_pct(ROOFLINE_COMPUTE)})" if report.compute_fraction is not None else ""))
    elif parts and report.compute_fraction is not None:
        parts.append(f"it computes at {_pct(report.compute_fraction)} of the measured matmul rate (the ceiling is "
                     f"{_pct(ROOFLINE_COMPUTE)})")
    located = [d for d in _order(out.drafts) if d.located and not d.hint]
    if located:
        parts.append(f"the code shows {located[0].why}")
    if report.ops and report.candidate is not None:
        parts.append(f"the measurement that would classify it: {_deciding_measurement(report, family)}")
    if not located and not out.withheld:
        parts.insert(0, "no rule found a clear limit in this profile")
    return "; ".join(parts)


def _rank(drafts: list[_Draft], code: str | None) -> list[Recommendation]:
    """By expected effect: the share of time a change should save, weighted by how sure the rule is."""
    ordered = _order(drafts)
    recs = []
    for rank, d in enumerate(ordered[:MAX_RECOMMENDATIONS], start=1):
        where = d.where
        if where is not None and code and (line := locate_definition(where, code)) is not None:
            where = f"line {line}"
        recs.append(Recommendation(rank=rank, title=d.title, action=d.action, where=where, why=d.why,
                                   expected_effect=d.expected_effect, confidence=d.confidence,  # type: ignore[arg-type]
                                   evidence=d.evidence))
    return recs


def _keep_specific(out: _Findings, bottleneck: Bottleneck) -> None:
    """Advice located in the code replaces texts chosen by bottleneck class alone; the speed facts become a note.

    A hint (a located change of small effect) replaces only the 'unknown' class text: a measured class
    names a bigger lever than the hint, and the speed comparison says more than it.
    """
    located = [d for d in out.drafts if d.located]
    if not located:
        return
    strong = any(not d.hint for d in located)
    for d in [d for d in out.drafts if d.generic and (strong or (bottleneck == "unknown" and not d.speed_based))]:
        out.drafts.remove(d)
        if d.speed_based:
            out.notes.append(f"{d.why}; the recommendations above say where in the code the time goes")


def _drop_what_is_there(out: _Findings, facts, report: ProfileReport) -> None:
    present = already_present(facts, report)
    for feature, why in out.avoid.items():
        present.setdefault(feature, Present(feature, None, why))
    kept = []
    for d in out.drafts:
        action, said = prune(d.title, d.action, present)
        out.notes.extend(said)
        if action is not None:
            d.action = action
            kept.append(d)
    out.drafts[:] = kept


_PRIORITY_ROOFLINE = 7


def _rule_roofline(report: ProfileReport, out: _Findings) -> None:
    """Classify from the timed bytes and FLOPs against the device's measured ceilings."""
    bw, comp = report.bandwidth_fraction, report.compute_fraction
    out.evidence.extend(roofline_evidence(report))
    if bw is not None and bw >= ROOFLINE_BANDWIDTH:
        out.claims.append(_hardware.Claim(
            "memory-bound", _PRIORITY_ROOFLINE, f"the candidate moves its inputs and outputs at {_pct(bw)} of the "
            "device's measured bandwidth: only moving fewer bytes makes it faster", [out.evidence[-1 if comp is None else -2]],
            "high", "memory-bound:at-ceiling"))
    elif comp is not None and comp >= ROOFLINE_COMPUTE:
        out.claims.append(_hardware.Claim(
            "compute-bound", _PRIORITY_ROOFLINE, f"the candidate computes at {_pct(comp)} of the device's measured "
            "matmul rate", [out.evidence[-1]], "high"))


def _deciding_measurement(report: ProfileReport, family: str) -> str:
    """The one measurement that would classify this profile, when nothing did: counters first (they see
    inside the kernel), then the roofline of the timed call; with both there and neither deciding, the
    breakdown of where the stalled cycles go (the middle band of IPC or of ncu's throughputs)."""
    if not report.counters:
        if family == "gpu":
            return "hardware counters: Nsight Compute (profile_kernel with hardware_counters on a host with ncu)"
        if report.counters_note and "<not supported>" in report.counters_note:
            return ("hardware counters from perf (IPC and cache misses) on a host whose CPU exposes them: here perf "
                    "reported them <not supported> (a virtual machine without a virtual PMU)")
        return "hardware counters from perf (IPC and cache misses; needs perf and perf_event_paranoid <= 2)"
    if report.bandwidth_fraction is None:
        return ("the achieved bandwidth against the device's measured ceiling (profile_kernel, with a reference whose "
                "inputs and outputs it can size)")
    if family == "gpu":
        return ("Nsight Compute's warp stall reasons for the hot kernel (the WarpStateStats section: long scoreboard, "
                "barrier, math pipe): the counters and the roofline put it between the ceilings")
    return ("perf's top-down breakdown of the hot loop (perf stat --topdown: frontend, bad speculation, backend memory "
            "or core): the counters and the roofline put it between the ceilings")


def _missing_data(report: ProfileReport) -> list[str]:
    missing = []
    if not report.ops:
        missing.append("an op table")
    if not report.counters:
        missing.append("hardware counters (perf on CPU, Nsight Compute on GPU)")
    if report.candidate is None:
        missing.append("timing against baselines (profile_kernel)")
    return missing


class RulesAnalyst:
    """Rule-based analyst: thresholds are the module constants; see the module docstring for the order."""

    name = "rules"

    def analyze(self, report: ProfileReport | None, *, text: str | None = None, code: str | None = None,
                previous: ProfileReport | None = None, compiler: CompilerFacts | None = None) -> Analysis:
        """Analyse `report`, or `text` parsed with `parse_profile_text` when `report` is None.

        Args:
            report: The normalized profile; when given, `text` is not parsed again.
            text: Pasted profiler output (torch.profiler table, Nsight Compute details).
            code: The candidate's source; recommendations naming its functions point at 'line N'.
            previous: An earlier profile of the same problem; fills `changes`.
            compiler: What the compilers reported (vectorizer remarks, libm imports, ptxas/Triton resources).

        Raises:
            ValueError: neither a report nor recognizable text was given.
        """
        if report is None:
            report = parse_profile_text(text) if text else None
            if report is None:
                raise ValueError("nothing to analyse: pass a ProfileReport, or text holding a torch.profiler "
                                 "key_averages().table() or Nsight Compute details (text or --csv --page details)")
        out = _Findings()
        for rule in (_rule_custom_share, _rule_framework_inside, _rule_launch, _rule_alloc_copy, _rule_host):
            rule(report, out)
        family = family_of(report)
        facts = read_source(code) if code else None
        if facts is not None:
            code_findings(report, facts, compiler, family, out)
        hardware = _hardware.classify(report)
        out.claims += hardware.claims
        out.evidence += hardware.evidence
        out.notes += hardware.notes
        _rule_roofline(report, out)
        winner = min(out.claims, key=lambda c: c.priority, default=None)  # min keeps the first of equals
        bottleneck: Bottleneck = winner.bottleneck if winner else "unknown"  # type: ignore[assignment]
        if winner is None:
            missing = _missing_data(report)
            if report.ops and report.candidate is not None:
                missing = [_deciding_measurement(report, family)]
            out.notes.append("to classify the bottleneck, add: " + missing[0])  # the one measurement that decides
        _weigh_by_class(out, bottleneck)
        _rule_speed(report, bottleneck, out)
        remedy = (winner.remedy if winner else None) or bottleneck
        _rule_hot_kernel(report, bottleneck, remedy, winner.confidence if winner else "low", out)
        _rule_noise(report, out)
        _keep_specific(out, bottleneck)
        _drop_what_is_there(out, facts, report)
        if text is not None:
            out.notes.append(f"analysed {report.collector} output parsed from text, so fewer facts: no timing, "
                             "no baselines, no calls per forward")
        why = winner.why if winner else _unclassified_why(report, out, family)
        evidence = list(winner.evidence) if winner else []
        for ev in out.evidence:
            if ev not in evidence:
                evidence.append(ev)
        return Analysis(provider=self.name, bottleneck=bottleneck, bottleneck_why=why, evidence=evidence,
                        recommendations=_rank(out.drafts, code),
                        changes=describe_changes(previous, report) if previous is not None else [],
                        notes=list(dict.fromkeys(out.notes)))
