"""Turn the evidence the workers gathered into the checks behind a verdict (server side, pure).

Each check says pass, fail, warn or skip and why, with numbers. Hard checks decide `correct`;
soft ones flag what a kernel engineer should read (framework-only candidates, streams, a problem
on which a trivial output would pass).
"""

from __future__ import annotations

import re
from typing import Any

from kforge.backends import backend_class, is_device_fault, is_out_of_memory
from kforge.profilers.report import host_paced_reason

from .models import Check, TrialReport
from .process.protocol import DecoyVerdict, NullOutcome, RevalidateReply, TrialVerdict
from .static_scan import Finding

__all__ = ["CODE_CHECKS", "STORABLE_FAILURES", "background_check", "integrity_checks", "stable_timing_check", "static_check",
           "timing_checks", "verify_checks", "wall_anchor_check", "why_not_stored", "anchor_exceeds"]

# -- what the result store may keep ------------------------------------------------------------------
# The store answers a repeated request (same code, inputs, options and versions) with the stored result,
# so it keeps only answers that depend on nothing but the code and the inputs: a correct verdict, a wrong
# output, a build, syntax or interface error, a check that the candidate's own code failed. What another
# run on a quieter or healthier machine can change is an answer about that run, never the candidate's
# verdict: timeouts, crashes (the out-of-memory killer's SIGKILL among them), early exits, device faults,
# running out of memory, failures of the reference, a compiler the machine stopped, and failed checks
# that the environment can fail (background work, timing). KForge's own errors raise and store nothing.
# `why_not_stored` is the rule; the store applies it to every result it writes and every one it serves.

#: Failure kinds that depend only on the candidate's code.
STORABLE_FAILURES = frozenset({"syntax_error", "build_error", "interface_error"})
#: Checks whose failure depends only on the code and the inputs. Any other failed check (no_background_work,
#: fresh_inputs, plausible_speed, visible_work, or a check added later and not listed here) keeps a result
#: out of the store.
CODE_CHECKS = frozenset({"static_scan", "harness_intact", "global_state", "outputs_match", "input_distributions",
                         "output_contract", "inputs_unmodified", "deterministic", "null_calibration", "custom_work",
                         "timed_outputs", "probe_memo"})
# A build the machine stopped: the compiler killed (out of memory, a signal), a full disk, a quota.
_MACHINE_STOPPED_BUILD = re.compile(r"Killed signal terminated program|died due to signal|No space left on device|"
                                    r"Disk quota exceeded|virtual memory exhausted|cannot allocate memory|"
                                    r"out of memory|Resource temporarily unavailable", re.IGNORECASE)


def why_not_stored(result: dict[str, Any]) -> str | None:
    """Why the store must not keep (or serve) this tool result, or None when it depends only on code and inputs.

    `result`: a CompileResult, VerifyResult or ProfileResult as JSON (`model_dump(mode="json")`).
    """
    for part in (result, result.get("compile") or {}):
        failure = part.get("failure")
        if not failure:
            continue
        kind = failure.get("kind")
        if failure.get("stage") == "reference":
            return f"the reference failed ({kind}), not the candidate"
        if kind not in STORABLE_FAILURES:
            return f"a {kind} says how this run went, not what the code does"
        said = " ".join([str(failure.get("message") or ""), str(failure.get("output_tail") or "")]
                        + [str(d.get("message") or "") for d in failure.get("diagnostics") or []])
        if kind == "build_error" and (hit := _MACHINE_STOPPED_BUILD.search(said)):
            return f"the machine stopped the compiler ({hit.group(0)})"
    for check in result.get("checks") or []:
        if check.get("status") == "fail" and check.get("name") not in CODE_CHECKS:
            return f"the {check.get('name')} check failed, and the environment can fail it"
    for trial in result.get("trials") or []:
        error = str(trial.get("error") or "")
        if is_out_of_memory(error) or is_device_fault(error):
            return f"trial {trial.get('trial')} ran out of memory or hit a device fault"
    return None


def static_check(findings: list[Finding]) -> Check:
    hard = [f for f in findings if f.hard]
    soft = [f for f in findings if not f.hard]
    say = lambda fs: "; ".join(f"line {f.line}: {f.message}" for f in fs[:4])  # noqa: E731
    if hard:
        return Check(name="static_scan", status="fail", hard=True, evidence=say(hard))
    if soft:
        return Check(name="static_scan", status="warn", hard=False, evidence=say(soft))
    return Check(name="static_scan", status="pass", hard=True, evidence="no known cheat patterns in the source")


def integrity_checks(integrity: dict[str, list[str]] | None, precision: str) -> list[Check]:
    if integrity is None:
        return []
    tampering, flags = integrity.get("tampering", []), integrity.get("flags", [])
    checks = [
        Check(name="harness_intact", status="fail" if tampering else "pass", hard=True,
              evidence="; ".join(tampering) if tampering else "timers, synchronize, comparison and tensor methods "
              "are the originals"),
        background_check(integrity.get("background", [])),
    ]
    strict = precision == "strict"
    checks.append(Check(
        name="global_state", status=("fail" if strict else "warn") if flags else "pass", hard=strict,
        evidence=("changed: " + "; ".join(flags) + (" (strict precision: the candidate may not switch to reduced "
                                                     "precision; declare precision='tf32' if intended)" if strict else ""))
        if flags else "numerics flags (TF32, reduced-precision reductions, default dtype) unchanged"))
    return checks


def background_check(background: list[str]) -> Check:
    return Check(name="no_background_work", status="fail" if background else "pass", hard=True,
                 evidence=("still running after the call returned: " + "; ".join(background[:4]) +
                           " (work there escapes the timer and can race the comparison)") if background
                 else "no threads or child processes left running")


def verify_checks(trials: list[TrialReport], raw_trials: list[TrialVerdict], prepared: dict[str, Any],
                  nulls: list[NullOutcome], custom: dict[str, Any] | None, precision: str,
                  decoy: DecoyVerdict | None = None) -> list[Check]:
    return [_outputs_check(trials, precision), _distribution_check(trials, prepared), _contract_check(trials, raw_trials),
            _inputs_check(raw_trials), _repeat_check(raw_trials)] + ([probe_memo_check(decoy)] if decoy else []) + [
            _calibration_check(nulls), _custom_work_check(custom)]


def probe_memo_check(decoy: DecoyVerdict) -> Check:
    """The candidate ran on inputs it had seen, then on the same tensors changed where a cheap probe cannot see."""
    if decoy.error:
        return Check(name="probe_memo", status="fail", hard=True,
                     evidence=f"the call on inputs changed in place failed: {decoy.error[:200]}")
    return Check(
        name="probe_memo", status="pass" if decoy.correct else "fail", hard=True,
        evidence="inputs changed in place where a cheap probe cannot see it (same tensors and addresses, same "
        "first and last elements, same values rotated, so the same sum) gave "
        + ("the new, right answer" if decoy.correct else
           f"a wrong answer ({'; '.join(decoy.problems)[:200]}): answers are memoized on a probe of the input"))


def _outputs_check(trials: list[TrialReport], precision: str) -> Check:
    bad = [t for t in trials if not t.correct]
    rels = [(o.rel_error, o.tolerance.rel_error_bound) for t in trials for o in t.outputs
            if o.rel_error is not None and o.tolerance and o.tolerance.rel_error_bound]
    worst = max(rels, default=None, key=lambda r: r[0] / r[1])
    norm = f"; worst relative L2 error {worst[0]:.3g} (bound {worst[1]:.3g})" if worst else ""
    if not bad:
        return Check(name="outputs_match", status="pass", hard=True,
                     evidence=f"{len(trials)}/{len(trials)} trials within tolerance at precision={precision}{norm}")
    t = bad[0]
    why = t.error or "; ".join(p for o in t.outputs for p in o.problems)[:300]
    return Check(name="outputs_match", status="fail", hard=True,
                 evidence=f"{len(bad)}/{len(trials)} trials wrong; first: trial {t.trial} ({t.distribution} inputs): {why}")


def _distribution_check(trials: list[TrialReport], prepared: dict[str, Any]) -> Check:
    used = sorted({t.distribution for t in trials})
    notes = prepared.get("notes") or []
    exact = "outputs also judged against the reference run in float64" if prepared.get("exact") else \
        f"no float64 reference: {prepared.get('exact_note')}"
    return Check(name="input_distributions", status="pass", hard=False,
                 evidence=f"fresh secret seeds per trial; distributions: {', '.join(used)}; {exact}"
                 + (f"; {'; '.join(notes)}" if notes else ""))


def _contract_check(trials: list[TrialReport], raw: list[TrialVerdict]) -> Check:
    problems = [f"trial {t.trial}: {p}" for t in trials for o in t.outputs for p in o.problems
                if any(k in p for k in ("torch.Tensor", "shape", "dtype", "device", "missing output", "extra output"))]
    problems += [f"trial {i}: {a}" for i, r in enumerate(raw) for a in r.aliases]
    if problems:
        return Check(name="output_contract", status="fail", hard=True, evidence="; ".join(problems[:4]))
    return Check(name="output_contract", status="pass", hard=True,
                 evidence="plain torch.Tensor outputs with the reference's shape, dtype and device, sharing no memory with inputs")


def _inputs_check(raw: list[TrialVerdict]) -> Check:
    modified = [f"trial {i}: input(s) {r.inputs_modified}" for i, r in enumerate(raw) if r.inputs_modified]
    if modified:
        return Check(name="inputs_unmodified", status="fail", hard=True,
                     evidence="the candidate wrote into its inputs: " + "; ".join(modified[:4]))
    return Check(name="inputs_unmodified", status="pass", hard=True, evidence="every input came back bit-identical")


def _repeat_check(raw: list[TrialVerdict]) -> Check:
    runs = [r.repeat for r in raw if r.repeat is not None]
    if not runs:
        return Check(name="deterministic", status="skip", hard=True, evidence="no repeated runs")
    wrong = [i for i, r in enumerate(raw) if r.repeat is not None and not r.repeat.repeat_correct]
    if wrong:
        first = raw[wrong[0]].repeat.repeat_problems
        return Check(name="deterministic", status="fail", hard=True,
                     evidence=f"the same inputs, run again after memory was filled with NaN, gave a wrong result in "
                     f"trial(s) {wrong}: part of the output is not written, or depends on stale memory"
                     + (f" ({first[0]})" if first else ""))
    differ = [i for i, r in enumerate(raw) if r.repeat is not None and not r.repeat.repeat_identical]
    if differ:
        return Check(name="deterministic", status="warn", hard=True,
                     evidence=f"repeated runs differ bitwise in trial(s) {differ} but stay within tolerance "
                     "(atomics or unordered reductions?)")
    return Check(name="deterministic", status="pass", hard=True,
                 evidence=f"{len(runs)} repeated run(s) after NaN-poisoning memory were bit-identical")


def _calibration_check(nulls: list[NullOutcome]) -> Check:
    applicable = [n for n in nulls if n.applicable]
    passing = [n.null for n in applicable if n.passes]
    saved = [n.null for n in applicable if n.elementwise_passes and not n.passes]
    if passing:
        return Check(name="null_calibration", status="warn", hard=False,
                     evidence=f"on this problem {', '.join(passing)} would also pass: the check cannot tell a correct "
                     "kernel from it (use a reference whose output depends on its inputs)")
    tested = ", ".join(n.null for n in applicable) or "none applicable"
    extra = f"; {', '.join(saved)} would pass the element-wise tolerance alone, the relative-error bound rejects it" \
        if saved else ""
    return Check(name="null_calibration", status="pass", hard=False, evidence=f"trivial outputs all fail: {tested}{extra}")


def _custom_work_check(custom: dict[str, Any] | None) -> Check:
    if custom is None:
        return Check(name="custom_work", status="skip", hard=False, evidence="not measured")
    if not custom["own"]:
        return Check(name="custom_work", status="warn", hard=False,
                     evidence="the candidate builds no kernels of its own (no load_inline extension, no @triton.jit): "
                     "ModelNew only calls framework ops")
    if not custom.get("observable"):
        return Check(name="custom_work", status="skip", hard=False,
                     evidence=custom.get("note") or f"its kernels ({', '.join(custom['own'][:3])}) are invisible to "
                     "the profiler on this host (interpreter)")
    if not custom["ran"]:
        return Check(name="custom_work", status="warn", hard=False,
                     evidence=f"none of its own kernels ({', '.join(custom['own'][:3])}) ran in a profiled call: a "
                     "fallback to framework ops, or dead code")
    share = f"{100 * custom['share']:.0f}%" if custom.get("share") is not None else "an unknown share"
    return Check(name="custom_work", status="pass", hard=False,
                 evidence=f"its own code ran ({', '.join(custom['ran'][:3])}) and took {share} of a call's "
                 f"{'device' if custom.get('basis') == 'device' else 'CPU'} time")


# Measured ceilings are what torch reaches (cuBLAS, a device copy), not the hardware's limits, so a
# hand-written kernel may beat them somewhat; far beyond them the timing missed work.
_BANDWIDTH_SLACK = 1.25
_COMPUTE_SLACK = 1.5


def timing_checks(stats: Any, revalidated: RevalidateReply, report: Any, precision: str) -> list[Check]:
    """Checks that the candidate's timing measured real work on real inputs (`revalidated`: the judge's reading of the
    timed calls' kept outputs, and of the timing decoy)."""
    wrong = revalidated.wrong
    checks = [Check(
        name="timed_outputs", status="fail" if wrong else "pass", hard=True,
        evidence=(f"{len(wrong)} of {revalidated.checked} re-validated timed calls gave wrong outputs (call "
                  f"{wrong[0].call}: {'; '.join(wrong[0].problems)[:200]}): it behaves differently while timed")
        if wrong else f"{revalidated.checked} timed calls (a secret random sample and the last) re-validated against "
        "the reference on their own inputs")]
    if (decoy := revalidated.decoy) is not None:
        checks.append(probe_memo_check(decoy))
    checks.append(stable_timing_check(report))
    sets = f"{stats.input_sets} distinct input sets, a fresh copy per call" if stats.input_sets else "fresh copies"
    checks.append(Check(
        name="fresh_inputs", status="fail" if stats.replay_suspected else "pass", hard=True,
        evidence=(next((w for w in stats.warnings if "seen before" in w), "replay suspected") if stats.replay_suspected
                  else f"timed calls walked through {sets}; calls on repeated inputs were not faster")))
    checks.append(Check(
        name="visible_work", status="warn" if stats.unseen_work else "pass", hard=False,
        evidence=(f"the device timer missed work (another stream or thread); the candidate's time is the host "
                  f"clock's {stats.host_median_us:.1f} us per call, closed after a device-wide sync")
        if stats.unseen_work else "host clock with a device-wide sync agrees with the device timer"))
    checks.append(_plausibility_check(report, precision))
    return checks


# A timed call (caches flushed before it) is no faster than the same calls back to back on the timing sets (their
# inputs not in the caches either), which the server times from outside the candidate's process; beyond this
# factor the timing is not the candidate's own.
_ANCHOR_SLACK = 1.3


# The launch pace allowed where it could not be measured: the slowest measured was 28.8 us per call (2x H100, 20
# candidates in flight, 2026-11-28); a timer that reads several times short on a longer kernel still fails.
_UNMEASURED_PACE_US = 50.0


def anchor_exceeds(median_us: float, anchor: dict[str, Any] | None) -> bool:
    """Whether the server's clock saw the calls run slower than the reported median allows (`wall_anchor_check`)."""
    if not anchor or anchor.get("per_call_us") is None:
        return False
    return anchor["per_call_us"] > _ANCHOR_SLACK * (median_us + (anchor.get("floor_us") or 0.0))


def wall_anchor_check(stats: Any, anchor: dict[str, Any] | None) -> Check:
    """The candidate's reported median against the server's own clock (`kforge.tools.profile._wall_anchor`)."""
    if anchor is None:
        return Check(name="wall_clock_anchor", status="skip", hard=True, evidence="no timing to compare")
    if anchor["per_call_us"] is None:
        return Check(name="wall_clock_anchor", status="skip", hard=True,
                     evidence=f"the host was busy: in the server's timed ops ({anchor['tried']} pairs) the worker was "
                              "preempted more than twice or kept waiting for a core, so its clock could not check "
                              "the candidate's timing")
    median_us, floor_us = stats.median_us, anchor.get("floor_us")
    if floor_us is None and anchor.get("floor_wanted") and anchor_exceeds(median_us, anchor) \
            and anchor["per_call_us"] <= _ANCHOR_SLACK * (median_us + _UNMEASURED_PACE_US):
        # Calls shorter than the host's launch pace go at that pace: without it measured, this clock cannot tell a
        # short kernel from a timer that reads short. An honest 10 us ReLU "failed" so on 2x H100, 20 candidates in
        # flight, when every op of the judge's was preempted (2026-11-28): a busy host, as above, not the code.
        return Check(name="wall_clock_anchor", status="skip", hard=True,
                     evidence=f"the host was busy: the server's clock measured {anchor['per_call_us']:.1f} us per call "
                              f"against a timed median of {median_us:.1f} us, but the host's own launch pace, which "
                              f"calls this short go at, could not be measured ({anchor.get('measurements', 1)} "
                              "measurement(s): the judge was preempted in every op), so its clock could not check the "
                              "candidate's timing")
    fixed = f"; each op's own cost, {anchor['fixed_us']:.0f} us, cancels" if anchor.get("fixed_us") is not None else ""
    seen = (f"the server's clock measured {anchor['per_call_us']:.1f} us per call: the difference between ops of "
            f"{anchor['calls']} and {2 * anchor['calls']} calls back to back through the timing sets (least of "
            f"{anchor['batches']} ops of each in which the worker was rarely preempted and hardly waited for a core{fixed}"
            f"{_measured_again(anchor)}); the timed median, caches flushed, is {median_us:.1f} us")
    # Back to back, a device's calls go no faster than the host launches them: the host's pace, measured in the
    # judge in the same rounds, is allowed on top of the median. Below it the clock cannot tell a short kernel from
    # a timer that reads short, and the evidence says so.
    if floor_us is not None:
        bound = anchor["per_call_us"] / _ANCHOR_SLACK - floor_us
        seen += (f"; the host's own pace, {floor_us:.1f} us per call (the judge's back-to-back calls of a one-element "
                 f"op, on the server's clock), is allowed on top")
        seen += (f": this clock shows the median is no less than {bound:.1f} us" if bound > 0 else
                 ": the calls went at the host's pace, so this clock cannot check a median this short (the host "
                 "launches slower than the kernel runs)")
    if anchor_exceeds(median_us, anchor):
        return Check(name="wall_clock_anchor", status="fail", hard=True,
                     evidence=f"{seen}: {anchor['per_call_us'] / median_us:.1f}x faster than the calls really ran. The "
                              "timing inside the candidate's process was changed (its timer or clock patched), or "
                              "the calls did less work while timed")
    return Check(name="wall_clock_anchor", status="pass", hard=True, evidence=seen)


def _measured_again(anchor: dict[str, Any]) -> str:
    if anchor.get("measurements", 1) <= 1:
        return ""
    return (f"; measured {anchor['measurements']} times, since the first measurement would have failed it: the least "
            "time per call and the highest host pace of them count")


def _plausibility_check(report: Any, precision: str) -> Check:
    bw, comp = report.bandwidth_fraction, report.compute_fraction
    if bw is None and comp is None:
        return Check(name="plausible_speed", status="skip", hard=True,
                     evidence="the device's ceilings or the problem's size are unknown")
    # The honest baselines show what this device reaches on these inputs after this flush; a ceiling measured
    # at a busier moment (or a cache larger than the flush) must not fail a candidate that is no faster.
    shown = _fastest_baseline_fraction(report)
    over = []
    if bw is not None and bw > _BANDWIDTH_SLACK * max(1.0, shown):
        over.append(f"moves the problem's inputs and outputs at {100 * bw:.0f}% of the measured DRAM bandwidth"
                    + (f" ({100 * shown:.0f}% reached by the fastest baseline)" if shown > 1.0 else ""))
    if comp is not None and comp > _COMPUTE_SLACK and precision == "strict":
        over.append(f"computes at {100 * comp:.0f}% of the measured matmul rate for its dtype")
    said = ", ".join(x for x in (f"bandwidth {100 * bw:.0f}%" if bw is not None else "",
                                 f"compute {100 * comp:.0f}%" if comp is not None else "") if x)
    if over:
        return Check(name="plausible_speed", status="fail", hard=True,
                     evidence="faster than this device allows with cold caches: " + "; ".join(over)
                     + ": work was skipped, cached across calls, or not timed")
    shown_said = f"; the fastest baseline reached {100 * shown:.0f}% of the bandwidth" if shown > 1.0 else ""
    return Check(name="plausible_speed", status="pass", hard=True,
                 evidence=f"within the device's measured ceilings ({said} of peak{shown_said})")


def _fastest_baseline_fraction(report: Any) -> float:
    """The share of the measured bandwidth that the fastest timed baseline reached (0 when unknown)."""
    candidate = getattr(report, "candidate", None)
    if not report.bandwidth_fraction or candidate is None or not candidate.median_us:
        return 0.0
    medians = [b.timing.median_us for b in getattr(report, "baselines", ()) if b.timing is not None and b.timing.median_us]
    return report.bandwidth_fraction * report.candidate.median_us / min(medians) if medians else 0.0


# A speedup interval wider than this fraction of the speedup ranks nothing: the comparison is noise.
_MAX_INTERVAL_WIDTH = 0.25
# A baseline whose IQR is this many times the candidate's (and over the width above) is blamed for its own noise.
_BASELINE_BLAME = 3.0


def _spread(stats: Any) -> float:
    """A series' interquartile range over its median (0 when unknown)."""
    q1, q3, median = (getattr(stats, k, None) for k in ("q1_us", "q3_us", "median_us"))
    return (q3 - q1) / median if q1 is not None and q3 is not None and median else 0.0


def _lock_clocks_hint(backend: str | None) -> str:
    """How the operator locks `backend`'s clocks (`Backend.lock_clocks_hint`), or "" where it says nothing."""
    try:
        return getattr(backend_class(backend), "lock_clocks_hint", "") if backend else ""
    except Exception:  # noqa: BLE001 - an unknown or broken plug-in: advice without the command
        return ""


def stable_timing_check(report: Any) -> Check:
    """Each comparison's interval must rank something. One that is wide because the *baseline's* own series varies
    (its IQR several times the candidate's: a torch.compile of a few-microsecond op whose host path outlasts the
    flush before each call, so each call's window holds a varying part of it; H200, 16 cores, 2026-11-27) says
    nothing about the candidate's timing: that baseline is not ranked against, and the check says so, as long as
    another comparison ranks. A wide one the candidate's own series shares fails the check."""
    timed = [b for b in getattr(report, "baselines", ()) if b.speedup_ci is not None and b.speedup]
    if not timed:
        return Check(name="stable_timing", status="skip", hard=True, evidence="no baseline was timed")
    wide = [b for b in timed if (b.speedup_ci[1] - b.speedup_ci[0]) / b.speedup > _MAX_INTERVAL_WIDTH]
    own = _spread(getattr(report, "candidate", None))
    noisy_baselines = [b for b in wide if _spread(b.timing) > max(_MAX_INTERVAL_WIDTH, _BASELINE_BLAME * own)]
    if noisy_baselines and len(noisy_baselines) < len(timed) and len(noisy_baselines) == len(wide):
        ranked = [b for b in timed if b not in noisy_baselines]
        said = "; ".join(f"vs {b.name} x{b.speedup:.2f} in [{b.speedup_ci[0]:.2f}, {b.speedup_ci[1]:.2f}]" for b in ranked)
        unranked = "; ".join(
            f"{b.name} not ranked against: its own timing varies (IQR {b.timing.q1_us:.2f}-{b.timing.q3_us:.2f} us "
            f"around {b.timing.median_us:.2f} us; the candidate's IQR is {100 * own:.0f}% of its median), x{b.speedup:.2f} "
            f"in [{b.speedup_ci[0]:.2f}, {b.speedup_ci[1]:.2f}]" for b in noisy_baselines)
        return Check(name="stable_timing", status="pass", hard=True,
                     evidence=f"speedups with ~95% intervals: {said}; {unranked}")
    said = "; ".join(f"vs {b.name} x{b.speedup:.2f} in [{b.speedup_ci[0]:.2f}, {b.speedup_ci[1]:.2f}]" for b in (wide or timed))
    if wide:
        series = [getattr(report, "candidate", None), *(b.timing for b in timed)]
        slowed = list(dict.fromkeys(r for t in series for r in getattr(t, "clock_slowdowns", None) or ()))
        hint = _lock_clocks_hint(getattr(report, "backend", None))
        host_paced = getattr(report, "host_paced", None) or host_paced_reason(report)  # either side's, once widened
        why = (f"the GPU ran below its clock while timed ({', '.join(slowed)}), so the kernels' times moved with "
               f"it: lock the clocks{f' ({hint})' if hint else ''} or profile again when the device is cool and idle"
               if slowed else host_paced or "the device or host was busy, or the kernel's time varies: profile again "
               "with a larger budget_s, on an idle device")
        return Check(name="stable_timing", status="fail", hard=True,
                     evidence=f"too noisy to rank: {said} (wider than {100 * _MAX_INTERVAL_WIDTH:.0f}% of the speedup); "
                     + why)
    return Check(name="stable_timing", status="pass", hard=True, evidence=f"speedups with ~95% intervals: {said}")
