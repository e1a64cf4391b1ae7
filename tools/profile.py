"""profile_kernel: time the candidate against eager and torch.compile baselines, then profile it.

Order of work: the judge builds the reference and makes a few input sets while the candidate worker
builds ModelNew; once it has loaded, the judge draws the timing inputs, and the candidate runs every
set once so its output is checked before any number is trusted; then, holding the device lock (one timing job per accelerator), the judge times the reference in
eager mode and under torch.compile and the candidate worker times ModelNew and records a
torch.profiler window and perf counters. Builds happen before the lock is taken, so a compile
never disturbs someone else's timing.
"""

from __future__ import annotations

import json
import math
import secrets
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from kforge.backends.base import DeviceFacts
from kforge.profilers.chart_processes import PendingCharts
from kforge.profilers.compiler_report import CANDIDATE_ARTIFACT
from kforge.profilers import profiler_for
from kforge.profilers.torch_profiler import TABLE_ARTIFACT, custom_share
from kforge.profilers.report import (Baseline, NcuKernel, ProfileReport, compare_words,
                                     speedup_interval, widen_for_host_pace)

from .context import Progress, ToolContext, no_progress

from .tool_inputs import RequestError
from .gpus import current as current_gpu, gpu_id, on_one_gpu, pin_env
from .steps import (candidate_inputs, fresh_seeds, job_spec, launch_once, prepare_judge, ready_candidate, warm_key,
                    with_jit_kernels)
from .models import Failure, OutputCheck, ProfileResult
from .process.protocol import (AnchorRequest, DecoyVerdict, EvidenceRequest, KeptOutputs, LaunchFloorRequest,
                               LoadRequest, PaceRequest, ProblemSizeRequest, ProfileRequest, ReadReportRequest, ReleaseRequest,
                               RevalidateReply, RevalidateRequest, SetupRequest, TimeReply, TimeRequest,
                               TimingDecoyRequest, TimingSetsRequest, TrialVerdict)
from .process.runner import HarnessError, WorkerDied, WorkerGroup, WorkerProcess
from .process.lifecycle import trace, traced
from .rounds import merge_rounds
from .static_scan import scan_candidate
from .trials import concurrently, judge_trials
from .verdict import anchor_exceeds, integrity_checks, stable_timing_check, static_check, timing_checks, wall_anchor_check

if TYPE_CHECKING:  # the job request, the one definition of the tool's inputs (not the worker's ProfileRequest op)
    from . import requests as job

__all__ = ["baseline_key", "baseline_stored", "profile_kernel", "time_baselines_ahead"]
_INPUT_SETS = 3  # input sets whose outputs are checked before timing
_MAX_TIMING_SETS = 64  # distinct input sets the timed calls walk through ...
_TIMING_SET_BYTES = 256 * 2**20  # ... as many as fit in this many bytes (at least 2, ...
_ONE_SET_BYTES = 2**30  # ... but only 1 for problems over this size)
_PROFILED_CALLS = 5
# ... fewer when they are long: torch.profiler's cost is its events, and five calls of a KernelBench LSTM (6,244
# launches, 41 ms each) took 6.5-17 s to profile (H200, 2026-12-01). The calls profiled fill about this much time.
_PROFILED_WINDOW_US = 20_000.0
_PACE_CALLS = 2  # calls of a baseline the judge profiles for its launches and device time (`_baseline_pace`)
# torch.compile's first call compiles (inductor, C++ on CPU); give it time beyond the timing budget.
_COMPILE_TIMEOUT_S = 600.0
# The server's own clock on the candidate's calls (`_wall_anchor`): ops of about this long and twice as long, each
# of at most so many calls; the difference of the two is the calls' own time.
_ANCHOR_BATCH_S = 0.001  # short: some escape preemption on a busy host
# Ops of at least this many calls, or of one call where a call takes `_ANCHOR_ONE_CALL_S` or more: the round trip's
# jitter (~0.1-0.2 ms) is then about 1% of the difference, and 27 calls of a 17 ms convolution took 0.46 s.
_ANCHOR_MIN_CALLS, _ANCHOR_ONE_CALL_S = 3, 0.01
_ANCHOR_BATCHES = 3  # ops of each length that were not preempted more than ...
_ANCHOR_SWITCHES_TOLERATED = 2  # ... this often wanted (on an idle 2-core VM a CPU matmul's 5 ms op is taken
# off its core once or twice by its own threads; a busy host takes it off more often) ...
_ANCHOR_WAIT_TOLERATED = 0.05  # ... nor kept waiting for a core for more than this share of the op's wall time
_ANCHOR_MAX_BATCHES = 40  # ... among at most this many pairs (~0.2 s in all)
_ANCHOR_MAX_CALLS = 5000
_ANCHOR_MEASUREMENTS = 3  # a failing anchor is measured again, up to this many times in all (`_confirmed_anchor`)
_FLOOR_CALLS = 200  # the judge's launch floor (`LaunchFloorRequest`): calls of 4-20 us, ops of about 1-4 ms
# The reference's baselines do not change between candidates: one timed on this device, with these
# versions and this budget, is reused for this long (an agent's loop profiles one problem many times;
# torch.compile's alone costs seconds to minutes per run). KernelBench ships precomputed baselines.
BASELINE_REUSE_S = 600.0


def _baseline_gpu(gpu: Any) -> str:
    """The GPU part of a stored baseline's key (`ctx.baseline_timings`): timed on this GPU, reused on it only."""
    return gpu_id(gpu) if gpu else ""


def baseline_key(reference_sha256: str | None, name: str, budget_s: float, environment: dict[str, Any],
                 gpu: Any) -> tuple[str, ...]:
    """A stored baseline's key in `ctx.baseline_timings`: reused only for this reference, budget, environment
    (versions, device) and GPU."""
    return (reference_sha256 or "", name, str(budget_s), json.dumps(environment, sort_keys=True), _baseline_gpu(gpu))


def _store_baseline(ctx: ToolContext, key: tuple[str, ...], series: dict[str, Any], eager_median_us: float) -> None:
    """Keep a baseline's merged series (`stats`, `rounds`) with the eager median it was timed beside (its canary)."""
    ctx.baseline_timings[key] = (time.monotonic(), {**series, "eager_median_us": eager_median_us})


def baseline_stored(ctx: ToolContext, reference_sha256: str, name: str) -> bool:
    """Whether a baseline `name` of this reference, timed on the GPU the call runs on, is young enough to be reused
    (with any budget or environment; `_time_in_rounds` keys them by those too)."""
    here, now = _baseline_gpu(placement.gpu if (placement := current_gpu()) else None), time.monotonic()
    return any(k[0] == reference_sha256 and k[1] == name and k[4] == here and now - when < BASELINE_REUSE_S
               for k, (when, _) in ctx.baseline_timings.items())


@on_one_gpu  # request.gpu
async def profile_kernel(ctx: ToolContext, request: job.ProfileRequest, progress: Progress = no_progress) -> ProfileResult:
    backend, reference_code, candidate_code = request.backend, request.reference_code, request.candidate_code
    baselines, budget_s, precision = request.baselines, request.budget_s, request.precision
    hardware_counters, fresh_baselines = request.hardware_counters, request.fresh_baselines
    avail = await ctx.require_backend(backend)
    counter_profiler = profiler_for(avail)  # the device's hardware counters: perf in the worker, ncu in a rerun, or none
    if not avail.timing:
        raise RequestError(f"backend {backend!r} cannot be timed on this host: {avail.reason}. "
                           "verify_against_reference works; profile on a host where the backend has a device.")
    use = ctx.device_use(ctx.device_key(avail))  # its trials and its timing (`DeviceUse`)
    options = {"baselines": list(baselines), "budget_s": budget_s, "precision": precision,
               "hardware_counters": hardware_counters}
    spec = await job_spec(ctx, "profile_kernel", backend, candidate_code, reference_code, options)
    if request.use_store and (hit := ctx.store.latest_profile_for(spec.key)):
        return ProfileResult(**{**hit, "from_store": True})
    t0 = time.perf_counter()
    late = _late_warmup(ctx, request, spec)
    if late is not None:  # its compile goes on beside this profile, which answers without waiting for it
        baselines = tuple(b for b in baselines if b != "torch.compile")
    # Measured by the server's own worker, once per device (before this job takes its workers and the device).
    device = await ctx.device_facts(backend)
    profile_id = uuid.uuid4().hex[:12]
    init_seed, seeds = fresh_seeds(_INPUT_SETS)
    steps = 6.0 + len(baselines) + _SHORT_CALL_ROUNDS - _ROUNDS  # a short call's extra rounds are steps too
    done = 0.0

    async def step(message: str) -> None:
        nonlocal done
        await progress(done, steps, message)
        done += 1

    def failed(failure: Failure, **extra: Any) -> ProfileResult:
        return ProfileResult(spec=spec, ok=False, failure=failure, seconds=round(time.perf_counter() - t0, 3), **extra)

    with ctx.scratch("profile") as scratch:
        async with AsyncExitStack() as stack:
            if late is not None:  # until its workers are given back (below, the group's exit): the warm-up waits
                stack.enter_context(late.late_profile())
            workers = await stack.enter_async_context(WorkerGroup(ctx.pool))
            # The refills of the workers taken here start once this job is done with the device: no fork
            # readies a device beside its timing, revalidation or torch.profiler window (`WorkerPool.hold_forks`).
            stack.callback(ctx.hold_forks())
            await step("running the reference in the judge worker while the candidate builds")

            async def judge_side() -> tuple[WorkerProcess | None, Failure | None, dict[str, Any]]:
                judge, failure, prepared = await prepare_judge(workers, ctx, backend, scratch, reference_code, seeds,
                                                                init_seed, exact=False,
                                                                compiled="torch.compile" in baselines)
                if judge is None or prepared is None:
                    return judge, failure, {}
                size = await judge.call(ProblemSizeRequest(), stage="reference")
                return judge, None, {"problem_bytes": size.problem_bytes, "problem_flops": size.problem_flops,
                                     "dtype": size.dtype, "reference_call_s": prepared.reference_call_s,
                                     "inputs": candidate_inputs(reference_code, seeds, init_seed), "prepared": prepared}

            (judge, failure, problem), (worker, compiled, _, cand_failure) = await concurrently(
                judge_side, lambda: ready_candidate(workers, ctx, backend, scratch, spec, candidate_code,
                                                     candidate_inputs(reference_code, seeds, init_seed)))
            ctx.pause_forks(light=True)  # as in a verify: the checks before the timing run without forks beside
            if failure is not None:
                return failed(failure)
            if worker is None:
                return failed(cand_failure)
            await step("checking the candidate's output, then making the timing inputs on both sides")
            # Fresh inputs for (nearly) every timed call, drawn after the candidate loaded: answers cannot
            # be replayed from earlier calls, nor computed ahead at import. Each process makes them on its
            # device from the same secret seeds.
            timing_seeds = fresh_seeds(_timing_set_count(problem["problem_bytes"]))[1]
            deadline, why = ctx.limits.hang_deadline(problem["reference_call_s"], 1)
            # Its trials run beside other jobs' runs, never beside a timing on the device (`DeviceUse`).
            async with use.run():
                try:
                    outcome, failure = await judge_trials(judge, worker, problem["prepared"], _INPUT_SETS,
                                                          judging={"precision": precision}, repeat=False,
                                                          calibrate=False, deadline=deadline, why=why)
                    if failure is not None:
                        return failed(failure)
                    if all(outcome.failures):
                        return failed(outcome.failures[0])
                    evidence = await worker.call(EvidenceRequest(custom_work=False), stage="forward")
                    compiled = with_jit_kernels(compiled, evidence)
                    made, cand_sets = await concurrently(
                        lambda: judge.call(TimingSetsRequest(seeds=timing_seeds), stage="reference"),
                        lambda: worker.call(TimingSetsRequest(seeds=timing_seeds, reference_source=reference_code),
                                            stage="timing"))
                    for reply in (made, cand_sets):
                        if reply.failure is not None:
                            return failed(reply.failure)
                except WorkerDied as died:
                    return failed(died.failure)
            check, output_correct = _first_wrong(outcome.trials)
            async with use.timing():
                ctx.pause_forks()
                try:
                    series = await _time_in_rounds(ctx, spec, judge, worker, baselines, budget_s,
                                                   fresh_baselines, step, problem["reference_call_s"])
                    timed = _timing_report(backend, device, series, series["candidate"], baselines, problem)
                    if late is not None:
                        timed = timed.model_copy(update={"baselines": timed.baselines + (
                            Baseline(name="torch.compile", pending=_pending_note(profile_id)),)})
                    # On a device clock the charts start now, in processes of their own, beside the server's clock
                    # and the last steps; a host clock would feel their CPU, so there they wait for the anchor.
                    on_device = series["candidate"]["stats"].clock == "device"
                    charts = PendingCharts(timed) if on_device else None
                    # Only where calls are queued to a device of its own can the host's launch pace hide a kernel's
                    # time (a CPU backend's timer reads "device" too, but its calls run as they are made).
                    queued = on_device and avail.kind == "gpu"
                    anchor = await _confirmed_anchor(worker, series["candidate"]["stats"].median_us,
                                                     problem["reference_call_s"], ctx.limits, judge if queued else None)
                except _TimingFailed as timing_failed:
                    return failed(timing_failed.failure)
                except WorkerDied as died:
                    return failed(died.failure)
                cand = series["candidate"]
                profiled_calls = _profiled_calls(cand["stats"].median_us)
                artifacts = ctx.store.artifact_dir(profile_id)
                rerun_warnings: list[str] = []

                async def last_steps() -> tuple[dict[str, Any], dict[str, Any], list[NcuKernel], str | None]:
                    revalidated = await _revalidate(judge, worker, cand["revalidation"], precision,
                                                    ctx.limits.hang_deadline(problem["reference_call_s"], 2)[0])
                    await step("profiling the candidate")
                    in_worker = counter_profiler is not None and counter_profiler.where == "worker"
                    prof = await worker.call(ProfileRequest(artifacts=str(worker.scratch), calls=profiled_calls,
                                                            counters=counter_profiler.name if in_worker else None),
                                             stage="profile")
                    if prof.failure is not None or counter_profiler is None or counter_profiler.where != "rerun" \
                            or not hardware_counters:
                        return revalidated, prof, [], None
                    await step(f"collecting {counter_profiler.title} metrics of the candidate's kernels")
                    return revalidated, prof, *await _rerun_pass(ctx, counter_profiler, backend, scratch, candidate_code,
                                                                 judge, worker.kernel_names, artifacts, problem["inputs"],
                                                                 rerun_warnings)

                try:
                    await step("reading the device's ceilings (measured once per device)")
                    charts = charts or PendingCharts(timed)
                    revalidated, prof, rerun_kernels, rerun_note = await last_steps()
                    if prof.failure is None:
                        timed = _with_device_pace(timed, prof, profiled_calls)
                        if timed.host_paced:
                            charts = PendingCharts(timed)  # the charts show the widened intervals
                    # What is left of their drawing (0.1-0.3 s each).
                    with traced("server", "profile.charts", to=ctx.limits.trace_file):
                        await charts.keep(artifacts)
                except WorkerDied as died:
                    return failed(died.failure)
                if prof.failure is not None:
                    return failed(prof.failure)
            with traced("server", "profile.artifacts", to=ctx.limits.trace_file):
                _keep_artifacts(scratch, artifacts, candidate_code, prof.trace)

    result_started = time.perf_counter()
    candidate_stats = cand["stats"]
    rows = list(prof.rows)
    report = timed.model_copy(update=dict(
        collector="torch.profiler", ops=tuple(rows), profiled_calls=profiled_calls,
        custom_share=custom_share(rows, prof.total_us, prof.basis),
        counters=tuple(prof.counters) + tuple(counter_profiler.counters(rerun_kernels) if counter_profiler else ()),
        counters_note=_counters_note(counter_profiler, prof.counters_note, rerun_kernels, rerun_note),
        ncu=tuple(rerun_kernels),
        notes=(f"timed with {candidate_stats.samples} samples in {candidate_stats.rounds} rounds interleaved with the "
               f"baselines', after warm-up, calls queued back to back with the caches flushed between them "
               f"(candidate, eager and torch.compile each with {candidate_stats.threads} host threads: torch's "
               "intra-op team, which every OpenMP runtime in the worker also gives a candidate's parallel regions)",)))
    warnings = list(candidate_stats.warnings) + ctx.sandbox_warnings() + rerun_warnings
    threads = {n: t["stats"].threads for n, t in series.items() if "stats" in t}
    if len(set(threads.values())) > 1:
        warnings.append("the series were timed with different thread counts ("
                        + ", ".join(f"{n} {t}" for n, t in threads.items()) + "): the speedups compare unlike runs")
    if not output_correct:
        warnings.append("the candidate's output did not match the reference on the profiled inputs; "
                        "fix correctness first (verify_against_reference)")
    checks = ([static_check(scan_candidate(candidate_code, backend))] + timing_checks(candidate_stats, revalidated, report, precision)
              + [wall_anchor_check(candidate_stats, anchor)] + integrity_checks(cand["integrity"], precision))
    trusted = _trusted(output_correct, checks)
    result = ProfileResult(spec=spec, ok=True, profile_id=profile_id, report=report, output_correct=output_correct,
                           output_check=check, checks=checks, speedup_trusted=trusted,
                           kernel_resources=[k for b in compiled.builds for k in b.kernels] + compiled.jit_kernels,
                           compiler_reports=[b.compiler_report for b in compiled.builds if b.compiler_report],
                           artifacts=[f"kforge://profiles/{profile_id}/artifacts/{n}"
                                                          for n in ctx.store.artifact_names(profile_id)],
                           warnings=warnings, seconds=round(time.perf_counter() - t0, 3))
    ctx.store.put_profile(profile_id, spec.key, backend, result.model_dump(mode="json"))
    speedups = {b.name: b.speedup for b in report.baselines}
    ctx.store.record_history(reference_sha256=spec.reference_sha256 or "", backend=backend,
                             candidate_sha256=spec.candidate_sha256, tool=spec.tool, correct=output_correct,
                             speedup_eager=speedups.get("eager"), speedup_compile=speedups.get("torch.compile"),
                             median_us=candidate_stats.median_us, trusted=trusted, profile_id=profile_id)
    trace("server", "profile.result", True, result_started, to=ctx.limits.trace_file)
    if late is not None and ctx.background is not None:
        eager = series.get("eager", {}).get("stats")
        ctx.background.start_soon(_add_late_baseline, ctx, result, late,
                                  baseline_key(spec.reference_sha256, "torch.compile", budget_s, spec.environment,
                                               spec.gpu), cand, eager.median_us if eager else None)
    await progress(steps, steps, "done")
    return result


def _trusted(output_correct: bool | None, checks: list[Any]) -> bool:
    """`speedup_trusted`: the output was right and no hard check failed."""
    return bool(output_correct) and not any(c.hard and c.status == "fail" for c in checks)


# How long a late baseline waits for its warm-up (its compile and its timing ahead) before it is given up.
_LATE_WAIT_S = _COMPILE_TIMEOUT_S


def _late_warmup(ctx: ToolContext, request: Any, spec: Any) -> Any:
    """The warm-up whose torch.compile baseline this profile adds after it answers (`late_baselines`), or None where
    the profile times torch.compile itself or waits for it. Only a warm-up beside the verify (a small problem's: a large
    one's gives way to this job) that will time the baseline ahead with this profile's budget, whose baseline is not
    stored yet, and on a server that keeps its profiles itself (a fleet node's go to the head)."""
    if not (request.late_baselines and ctx.late_baselines and "torch.compile" in request.baselines) \
            or request.fresh_baselines or not ctx.warm_timing or request.budget_s != ctx.timing_budget_s:
        return None
    if baseline_stored(ctx, spec.reference_sha256 or "", "torch.compile"):
        return None
    warmup = ctx.warmups.get(warm_key(request.backend, request.reference_code))
    return warmup if warmup is not None and not warmup.after_job else None


def _pending_note(profile_id: str) -> str:
    return (f"compiling ahead for this new problem; timed once compiled and added to this profile (read "
            f"kforge://profiles/{profile_id} or summarize_profile in a few seconds), and reused by the next profile of "
            "this reference; late_baselines=false waits for it")


async def _add_late_baseline(ctx: ToolContext, result: ProfileResult, warmup: Any, key: tuple[str, ...],
                             cand: dict[str, Any], eager_median_us: float | None) -> None:
    """Once the warm-up is done, its stored torch.compile baseline against this profile's candidate, with the
    profile's eager as its canary (as a reused one: within `_CANARY_TOLERANCE`, its interval widened by the drift),
    put into the stored profile in place of the pending one; or why it could not be."""
    answered = time.monotonic()
    started = time.perf_counter()
    with anyio.move_on_after(_LATE_WAIT_S):
        await warmup.done.wait()
    stored = ctx.baseline_timings.get(key)
    if stored is None:
        late = Baseline(name="torch.compile", error="compiled ahead for this new problem, but not timed there (the "
                        "warm-up failed or gave way): profile again to compare against torch.compile")
    elif eager_median_us is None or abs(drift := eager_median_us / stored[1]["eager_median_us"] - 1) > _CANARY_TOLERANCE:
        late = Baseline(name="torch.compile", error=(
            "timed ahead, but eager there did not time within 2% of this profile's eager"
            + (f" ({100 * drift:+.1f}%)" if eager_median_us is not None else "")
            + ": the host moved between them; profile again to compare against torch.compile"))
    else:
        late = _baseline("torch.compile", {**stored[1], "drift": drift}, cand).model_copy(
            update={"added_after_s": round(time.monotonic() - answered, 1)})
    report = result.report
    others = tuple(b for b in report.baselines if b.name != "torch.compile")
    report = widen_for_host_pace(report.model_copy(update={"baselines": others + (late,)}))
    checks = [stable_timing_check(report) if c.name == "stable_timing" else c for c in result.checks]
    trusted = _trusted(result.output_correct, checks)
    amended = result.model_copy(update={"report": report, "checks": checks, "speedup_trusted": trusted})
    ctx.store.amend_profile(result.profile_id, amended.model_dump(mode="json"),
                            speedup_compile=late.speedup, trusted=trusted)
    trace("server", "profile.late_baseline", True, started, to=ctx.limits.trace_file,
          outcome="added" if late.speedup is not None else late.error)


async def _confirmed_anchor(worker: WorkerProcess, median_us: float, reference_call_s: float | None,
                            limits: Any, judge: WorkerProcess | None = None) -> dict[str, Any] | None:
    """`_wall_anchor`, measured again (up to `_ANCHOR_MEASUREMENTS` times in all) while it would fail the candidate:
    on a busy host one measurement's launch floor read 3.7 us where the rounds around it read 9-21 us, and an honest
    7.8 us ReLU failed (2x H200, 20 candidates in flight, 2026-11-27). The least time per call and the highest floor
    of the measurements count; a rescaled timer fails every one (20x and more)."""
    anchor = await _wall_anchor(worker, median_us, reference_call_s, limits, judge)
    measured = 1
    while anchor is not None and measured < _ANCHOR_MEASUREMENTS and anchor_exceeds(median_us, anchor):
        again = await _wall_anchor(worker, median_us, reference_call_s, limits, judge)
        measured += 1
        anchor = {**anchor, "measurements": measured}  # (one the host left unusable counts as taken too)
        if again is None or again["per_call_us"] is None:
            continue
        floors = [f for f in (anchor.get("floor_us"), again.get("floor_us")) if f is not None]
        anchor.update(per_call_us=min(anchor["per_call_us"], again["per_call_us"]),
                      floor_us=max(floors) if floors else None)
    return anchor


async def _wall_anchor(worker: WorkerProcess, median_us: float, reference_call_s: float | None,
                       limits: Any, judge: WorkerProcess | None = None) -> dict[str, Any] | None:
    """The candidate's calls timed by the server's clock, outside the candidate's process (issue 17): ops of N and
    of 2N back-to-back calls through the timing sets, and the calls' time the difference of the two (least of
    each). What an op costs besides its calls cancels out: the round trip, and the first call's allocation of
    its output (a 4 GB output is given back between ops: with it counted, honest calls ran 1.4-1.7x slower
    than timed, H100 2026-11-24). Only ops in which the worker's threads were preempted at most twice, and waited
    for a core for at most 5% of the op, count (the server reads both in /proc): on a busy host an op's wall
    time is the other processes' too.

    With `judge` (a device clock), the judge's launch floor is timed the same way in the same rounds: back to back,
    a launch-bound kernel's calls go at the host's pace of launching, not at the kernel's, and that pace ranged
    4-17 us per call on an idle or loaded H100 host against a 7.1 us ReLU (H100 2026-11-25). None without a median."""
    if not median_us or median_us <= 0:
        return None
    least = 1 if median_us * 1e-6 >= _ANCHOR_ONE_CALL_S else _ANCHOR_MIN_CALLS
    calls = max(least, min(_ANCHOR_MAX_CALLS, math.ceil(_ANCHOR_BATCH_S / (median_us * 1e-6))))
    series: dict[str, tuple[WorkerProcess, Any, int]] = {"candidate": (worker, AnchorRequest, calls)}
    if judge is not None:
        series["floor"] = (judge, LaunchFloorRequest, _FLOOR_CALLS)
    walls = {name: {n: [] for n in (c, 2 * c)} for name, (_, _, c) in series.items()}
    tried = 0

    def short_of_batches() -> bool:
        return min(len(w) for lengths in walls.values() for w in lengths.values()) < _ANCHOR_BATCHES

    while tried < _ANCHOR_MAX_BATCHES and short_of_batches():
        tried += 1
        for name, (proc, request, _) in list(series.items()):
            for n in walls[name]:
                before = proc.preemptions()
                started = time.perf_counter()
                reply = await proc.call(request(calls=n), stage="timing",
                                        timeout_s=limits.hang_deadline(reference_call_s, n)[0])
                wall = time.perf_counter() - started
                if reply.failure is not None and name == "floor":
                    del series[name], walls[name]  # the judge's own op: no floor, and no fault of the candidate
                    break
                if reply.failure is not None:
                    raise _TimingFailed(reply.failure)
                after = proc.preemptions()
                if before is not None and after is not None \
                        and after.switches - before.switches <= _ANCHOR_SWITCHES_TOLERATED \
                        and after.waited_s - before.waited_s <= _ANCHOR_WAIT_TOLERATED * wall:
                    walls[name][n].append(wall)

    def per_call_us(name: str) -> tuple[float | None, float | None]:
        if name not in walls:
            return None, None
        c = series[name][2]
        short, long = walls[name][c], walls[name][2 * c]
        if not short or not long:
            return None, None
        return max(0.0, min(long) - min(short)) / c * 1e6, max(0.0, 2 * min(short) - min(long)) * 1e6

    cand_us, fixed_us = per_call_us("candidate")
    short, long = walls["candidate"][calls], walls["candidate"][2 * calls]
    return {"calls": calls, "batches": min(len(short), len(long)), "tried": tried, "per_call_us": cand_us,
            "fixed_us": fixed_us, "floor_us": per_call_us("floor")[0], "floor_wanted": judge is not None}


async def _revalidate(judge: WorkerProcess, worker: WorkerProcess, kept: list[KeptOutputs],
                      precision: str, deadline: float | None) -> RevalidateReply:
    """The judge re-validates the timed outputs the candidate kept, then the decoy: the timed function on
    timing set 0 changed in place where a cheap probe cannot see it (run only after the judge read the
    kept outputs, which include the last call's own buffers)."""
    revalidated = await judge.call(RevalidateRequest(items=kept, precision=precision), stage="compare")
    await worker.call(ReleaseRequest(), stage="timing")
    decoy = await worker.call(TimingDecoyRequest(shift=1 + secrets.randbelow(2**30)), stage="timing",
                              timeout_s=deadline)
    if decoy.error is not None or decoy.outputs is None:
        error = decoy.error or (decoy.failure.message if decoy.failure else "the decoy call held no outputs")
        return revalidated.model_copy(update={"decoy": DecoyVerdict(correct=False, error=error)})
    item = KeptOutputs(call=decoy.call, set=decoy.set, outputs=decoy.outputs, decoy_shift=decoy.decoy_shift)
    judged = await judge.call(RevalidateRequest(items=[item], precision=precision), stage="compare")
    await worker.call(ReleaseRequest(), stage="timing")
    return revalidated.model_copy(update={"decoy": judged.decoy})


def _timing_report(backend: str, device: DeviceFacts, series: dict[str, dict[str, Any]], cand: dict[str, Any],
                   baselines: tuple[str, ...], problem: dict[str, Any]) -> ProfileReport:
    """The report's timings, speedups and roofline: all the charts show, before the op table and counters."""
    stats = cand["stats"]
    return ProfileReport(
        backend=backend, device_name=device.device_name, collector="torch.profiler", candidate=stats,
        baselines=tuple(_baseline(n, series[n], cand) for n in baselines), device=device,
        problem_bytes=problem["problem_bytes"], problem_flops=problem["problem_flops"],
        **ProfileReport.roofline(device, stats.median_us, problem["problem_bytes"], problem["problem_flops"],
                                 problem["dtype"]))


def _profiled_calls(median_us: float | None) -> int:
    """Calls in the torch.profiler window: `_PROFILED_CALLS`, fewer (at least one) for calls of several ms."""
    if not median_us or median_us <= 0:
        return _PROFILED_CALLS
    return max(1, min(_PROFILED_CALLS, int(_PROFILED_WINDOW_US // median_us)))


def _device_pace(prof: Any, calls: int) -> dict[str, float | None]:
    """Per profiled call (`calls` of them): the device launches, and on a GPU the device's busy time (its kernels'
    durations)."""
    return {"launches_per_call": prof.device_launches / calls if prof.device_launches else None,
            "host_launches_per_call": prof.host_launches / calls if getattr(prof, "host_launches", 0) else None,
            "device_us_per_call": prof.total_us / calls if prof.basis == "device" and prof.rows else None}


def _with_device_pace(timed: ProfileReport, prof: Any, calls: int) -> ProfileReport:
    """The timing report with the profile's device pace, its speedups' intervals widened (`widen_for_host_pace`)
    where that shows the candidate's call running at the host's pace."""
    return widen_for_host_pace(timed.model_copy(update=_device_pace(prof, calls)))


def _keep_artifacts(scratch: Path, artifacts: Path, candidate_code: str, trace: str | None) -> None:
    """What summarize_profile and the artifact resources read later: the code, the trace, the op table, the logs."""
    (artifacts / CANDIDATE_ARTIFACT).write_text(candidate_code)
    if trace:
        shutil.copy(scratch / "candidate" / trace, artifacts / "trace.json")
    if (table := scratch / "candidate" / TABLE_ARTIFACT).exists():
        shutil.copy(table, artifacts / TABLE_ARTIFACT)
    for role in ("candidate", "judge"):
        log = scratch / role / f"{role}.log"
        if log.exists() and log.stat().st_size:
            shutil.copy(log, artifacts / f"{role}.log")


def _first_wrong(trials: list[TrialVerdict]) -> tuple[OutputCheck | None, bool]:
    """The first failing output check (or the first check) and whether all trials were correct."""
    first = None
    for t in trials:
        for c in t.checks:
            first = first or c
            if not c.correct:
                return c, False
        if t.error:
            return first, False
    return first, True


def _baseline(name: str, timed: dict[str, Any], candidate: dict[str, Any]) -> Baseline:
    if timed.get("failure"):
        f = timed["failure"]
        return Baseline(name=name, error=f"{f.kind}: {f.message}"[:500])
    ratio, (lo, hi) = speedup_interval(timed["rounds"], candidate["rounds"])
    if timed.get("drift") is not None:  # not interleaved with this run (reused, or late): widen by the canary's drift
        drift = abs(timed.get("drift", 0.0))
        lo, hi = lo * (1 - drift), hi * (1 + drift)
    return Baseline(name=name, timing=timed["stats"], speedup=round(ratio, 4), speedup_ci=(round(lo, 4), round(hi, 4)),
                    comparison=compare_words((lo, hi)), reused_after_s=timed.get("reused_after_s"),
                    **timed.get("pace", {}))


_ROUNDS = 3  # rounds per series, interleaved: drift between the processes shows in the interval
# ... and more for calls this short, whose rounds cost little: with 3 rounds the interval's t-factor (4.30 over
# sqrt 3) made a ~5% round-to-round drift of a 6 us ReLU an interval 27% wide (H200, 16 cores, 2026-11-27).
_SHORT_CALL_S, _SHORT_CALL_ROUNDS = 1e-3, 5
_CALLS_OUTSIDE_BUDGET = 24  # warm-up, estimate, the last batch's overrun, cross-check and decoy calls of a round
_CANARY_TOLERANCE = 0.02  # a stored torch.compile baseline is reused only while eager still times within this


class _TimingFailed(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def _timing_set_count(problem_bytes: int) -> int:
    """Distinct timing input sets: as many as fit in `_TIMING_SET_BYTES`, at least 2 (fresh beside warm-up)."""
    if problem_bytes > _ONE_SET_BYTES:  # a second set would double the memory of a problem this large
        return 1
    return max(2, min(_MAX_TIMING_SETS, _TIMING_SET_BYTES // max(1, problem_bytes)))


async def _time_in_rounds(ctx: ToolContext, spec: Any, judge: WorkerProcess, worker: WorkerProcess,
                          baselines: tuple[str, ...], budget_s: float, fresh_baselines: bool,
                          step: Any, reference_call_s: float | None) -> dict[str, dict[str, Any]]:
    """Time the baselines (judge) and the candidate in `_ROUNDS` interleaved rounds (`_SHORT_CALL_ROUNDS` when the
    reference's call is shorter than `_SHORT_CALL_S`), sharing `budget_s`.

    Eager is always timed (it costs no compilation) and goes first: it is the canary that decides whether
    a torch.compile baseline stored by an earlier profile of this reference still holds. That one is
    reused only when it is recent, was taken with the same versions and budget, `fresh_baselines` is off,
    and eager times now within `_CANARY_TOLERANCE` of eager then, on its first round and over all its rounds;
    otherwise it is timed in this run.
    """
    def key(name: str) -> tuple[str, ...]:
        return baseline_key(spec.reference_sha256, name, budget_s, spec.environment, spec.gpu)

    stored = {n: ctx.baseline_timings.get(key(n)) for n in baselines if n != "eager"}
    stored = {n: v for n, v in stored.items()
              if v is not None and not fresh_baselines and time.monotonic() - v[0] < BASELINE_REUSE_S}
    order = ["eager"] + [n for n in baselines if n != "eager" and n not in stored] + ["candidate"]
    replies: dict[str, list[TimeReply]] = {n: [] for n in order}
    failures: dict[str, Failure] = {}
    rounds = _round_count(reference_call_s)
    policy = {"budget_s": budget_s / rounds}
    # A round is its budget plus warm-up, the estimate and the cross-check: ~_CALLS_OUTSIDE_BUDGET calls.
    deadline, why = ctx.limits.hang_deadline(reference_call_s, _CALLS_OUTSIDE_BUDGET)
    deadline = deadline and deadline + budget_s / rounds

    async def time_baseline(name: str) -> TimeReply:
        return await _time_baseline(judge, name, policy, first_round=not replies[name])

    for r in range(rounds):
        await step(f"timing round {r + 1} of {rounds}: {', '.join(order)}")
        for name in _rotated(order, r):
            if name in failures:
                continue
            if name == "candidate":
                # The server looks for work the candidate left running once, after its last round (40 ms a look).
                reply = await worker.call(TimeRequest(label=name, policy=policy, revalidate=True,
                                                      share_outputs=r == rounds - 1),
                                          stage="timing", timeout_s=deadline, timeout_why=why, watch_background=False)
                if reply.failure is not None:
                    raise _TimingFailed(reply.failure)
            else:
                reply = await time_baseline(name)
                if name == "eager" and r == 0:  # the canary: decides which stored baselines still hold
                    order, stored = _check_canary(order, stored, reply)
                    replies.update({n: [] for n in order if n not in replies})
                if reply.failure is not None:
                    failures[name] = reply.failure
                    continue
            replies[name].append(reply)
    # The canary decided on eager's first round; the whole eager series may still have moved since the stored
    # baselines were timed (a noisy host): those are timed now after all, in rounds of their own.
    eager_rounds = replies.get("eager") or []
    if stored and eager_rounds and "eager" not in failures:
        eager_all = merge_rounds("eager", [r.model_dump(mode="json") for r in eager_rounds])[0].median_us
        for name in [n for n, v in stored.items() if abs(eager_all / v[1]["eager_median_us"] - 1) > _CANARY_TOLERANCE]:
            del stored[name]
            replies[name] = []
            await step(f"the host moved since the stored {name} baseline: timing it again")
            for _ in range(rounds):
                reply = await time_baseline(name)
                if reply.failure is not None:
                    failures[name] = reply.failure
                    break
                replies[name].append(reply)
    out: dict[str, dict[str, Any]] = {}
    for name, rs in replies.items():
        if name in failures:
            out[name] = {"failure": failures[name]}
            continue
        stats, per_round = merge_rounds(name, [r.model_dump(mode="json") for r in rs])
        out[name] = {"stats": stats, "rounds": per_round}
        if name != "candidate":
            out[name]["pace"] = await _baseline_pace(judge, name, stats.median_us)
    last = replies["candidate"][-1]
    integrity = dict(last.integrity or {})
    integrity["background"] = list(integrity.get("background", [])) + await worker.background_seen()
    out["candidate"].update(revalidation=last.revalidation or [], integrity=integrity)
    eager_now = out["eager"]["stats"].median_us if "stats" in out.get("eager", {}) else None
    for name in baselines:
        if name in stored:
            when, earlier = stored[name]
            out[name] = {**earlier, "reused_after_s": round(time.monotonic() - when, 1),
                         "drift": eager_now / earlier["eager_median_us"] - 1}
        elif name != "eager" and "stats" in out.get(name, {}) and eager_now:
            _store_baseline(ctx, key(name), out[name], eager_now)
    return out


def _round_count(reference_call_s: float | None) -> int:
    return _SHORT_CALL_ROUNDS if reference_call_s is not None and reference_call_s < _SHORT_CALL_S else _ROUNDS


def _rotated(order: list[str], r: int) -> list[str]:
    """Round r's order: each series starts a round in turn, so drift between the processes shows in the interval."""
    return order[r % len(order):] + order[:r % len(order)]


async def _time_baseline(judge: WorkerProcess, name: str, policy: dict[str, Any], *, first_round: bool) -> TimeReply:
    """One round of a baseline in the judge; torch.compile's first one compiles, under the compile deadline."""
    first_compile = name == "torch.compile" and first_round
    return await judge.call(TimeRequest(label=name, compile=(name == "torch.compile"), policy=policy),
                            stage=f"timing {name}", timeout_s=_COMPILE_TIMEOUT_S if first_compile else None,
                            watch_background=False)


async def time_baselines_ahead(ctx: ToolContext, judge: WorkerProcess, key: Any, baselines: tuple[str, ...],
                               budget_s: float, reference_call_s: float | None, problem_bytes: int,
                               stop: Callable[[], bool] | None = None,
                               between: Callable[[], Awaitable[None]] | None = None) -> bool:
    """Time `baselines` of the reference that `judge` has loaded and prepared, as a profile with `budget_s` times
    them (its timing sets, its rounds, eager first in the rotation as their canary), and store them for the profiles
    that follow: `_time_in_rounds` reuses one while eager still times within `_CANARY_TOLERANCE` of eager here, and
    says how old it is. `key(name)` is the stored baseline's key (`baseline_key`). The caller holds the device's
    timing use; `between()` runs before each round (a warm-up gives the device to the jobs waiting for it). Returns
    whether they were stored (not on any failure, nor when `stop()` said so before a round)."""
    made = await judge.call(TimingSetsRequest(seeds=fresh_seeds(_timing_set_count(problem_bytes))[1]),
                            stage="reference")
    if made.failure is not None:
        return False
    rounds = _round_count(reference_call_s)
    policy = {"budget_s": budget_s / rounds}
    order = ["eager", *baselines]
    replies: dict[str, list[dict[str, Any]]] = {n: [] for n in order}
    for r in range(rounds):
        for name in _rotated(order, r):
            if between is not None:
                await between()
            if stop is not None and stop():
                return False
            reply = await _time_baseline(judge, name, policy, first_round=not replies[name])
            if reply.failure is not None:
                return False
            replies[name].append(reply.model_dump(mode="json"))
    eager_median = merge_rounds("eager", replies["eager"])[0].median_us
    for name in baselines:
        stats, per_round = merge_rounds(name, replies[name])
        pace = await _baseline_pace(judge, name, stats.median_us)
        _store_baseline(ctx, key(name), {"stats": stats, "rounds": per_round, "pace": pace}, eager_median)
    return True


async def _baseline_pace(judge: WorkerProcess, name: str, median_us: float | None) -> dict[str, float | None]:
    """A baseline's launches and device time per call, profiled in the judge after its rounds (a few calls, as many
    as the candidate's profile makes): what names a baseline whose call runs at the host's pace. Empty where the
    judge could not say (the speedup is then widened on the candidate's pace alone). Two calls at most: a call's
    launches and device time do not move from call to call, and five of a level-3 network (87-460 launches each) took
    the judge 0.4-0.75 s to profile and tabulate (H200, 2026-12-02)."""
    calls = min(_PACE_CALLS, _profiled_calls(median_us))
    reply = await judge.call(PaceRequest(label=name, calls=calls), stage=f"timing {name}", watch_background=False)
    if reply.failure is not None:
        return {}
    return {"launches_per_call": reply.launches / calls if reply.launches else None,
            "host_launches_per_call": reply.host_launches / calls if reply.host_launches else None,
            "device_us_per_call": reply.device_us / calls if reply.device_us else None}


def _check_canary(order: list[str], stored: dict[str, Any], eager_reply: TimeReply) -> tuple[list[str], dict[str, Any]]:
    """Drop stored baselines whose eager canary moved (or could not be timed); they are timed in this run instead."""
    eager_now = eager_reply.timing.median_us if eager_reply.timing is not None and eager_reply.failure is None else None
    keep = {n: v for n, v in stored.items()
            if eager_now is not None and abs(eager_now / v[1]["eager_median_us"] - 1) <= _CANARY_TOLERANCE}
    redo = [n for n in stored if n not in keep]
    return order[:1] + redo + order[1:], keep


async def _rerun_pass(ctx: ToolContext, profiler: Any, backend: str, scratch: Path, candidate_code: str,
                      judge: WorkerProcess, kernel_names: list[str], artifacts: Path, inputs: SetupRequest,
                      warnings: list[str]) -> tuple[list[NcuKernel], str | None]:
    """Run the candidate once more under a rerun profiler (`profiler.where == "rerun"`: Nsight Compute), the profiler
    and the candidate in one sandbox of their own (`WorkerProcess._command`); the judge reads the report, which is
    kept among the profile's artifacts with the profiler's log. What of that sandbox this host refused beyond what
    every worker lacks (`ToolContext.sandbox_warnings`) goes to `warnings`."""
    where = scratch / "rerun"
    where.mkdir(parents=True, exist_ok=True)
    report, log = where / "profile", where / profiler.log_name
    prefix = profiler.command(report, log, kernel_names, launches=profiler.launches)
    if prefix is None:
        return [], (f"{profiler.name} not found on PATH: install {profiler.title} for hardware metrics (timing and "
                    "torch.profiler are unaffected)")
    problem = None
    try:
        # The profiler's install stays readable in the sandbox wherever it lies (not only under /usr or /opt); HOME:
        # Nsight Compute deploys its section files under it, and the server's is out of the sandbox's reach.
        limits = replace(ctx.limits, read_paths=(*ctx.limits.read_paths, profiler.install_dir(prefix[0])))
        async with WorkerProcess(backend=backend, home=ctx.home, scratch=where, limits=limits, role="rerun",
                                 prefix=prefix, extra_env={**pin_env(current_gpu()), "HOME": str(where)}) as w:
            if missing := [m for m in w.isolation["missing"] if m not in ctx.worker_isolation.get("missing", [])]:
                warnings.append(f"the {profiler.title} run's sandbox is incomplete on this host: {'; '.join(missing)}")
            loaded = await w.call(LoadRequest(role="candidate", source=candidate_code), stage="rerun",
                                  timeout_s=profiler.timeout_s)
            if loaded.failure is None:
                await launch_once(w, inputs, timeout_s=profiler.timeout_s)
    except (WorkerDied, HarnessError) as exc:
        problem = f"the run under {profiler.name} failed: {exc}"[:400]
    rep = report.with_suffix(profiler.report_suffix)
    log_text = log.read_text(errors="replace") if log.exists() else ""
    if log_text:
        shutil.copy(log, artifacts / profiler.log_name)
    if not rep.exists():
        return [], profiler.log_problem(log_text) or problem or (f"{profiler.name} wrote no report (see artifact "
                                                                 f"{profiler.log_name})")
    kept = "profile" + profiler.report_suffix
    shutil.copy(rep, artifacts / kept)
    readable = judge.scratch / kept  # the judge's sandbox shows it only its own directory
    shutil.copy(rep, readable)
    reply = await judge.call(ReadReportRequest(profiler=profiler.name, report=str(readable), custom_names=kernel_names),
                             stage="rerun")
    return list(reply.kernels), reply.note


def _counters_note(profiler: Any, perf_note: str | None, rerun_kernels: list[NcuKernel],
                   rerun_note: str | None) -> str | None:
    """Why hardware counters are missing, for the device's own profiler (perf in the worker on CPUs, Nsight Compute
    in a rerun on NVIDIA GPUs)."""
    if profiler is not None and profiler.where == "rerun":
        return None if rerun_kernels else (rerun_note or f"{profiler.title} was not run (hardware_counters=False) or "
                                           "collected no kernels")
    return perf_note
