"""compile_kernel and verify_against_reference as plain async functions (profile_kernel: `profile.py`).

Each one runs user code only in workers (see `kforge.tools.harness.worker`): a *candidate* worker builds and
runs ModelNew; for verify and profile a separate *judge* worker builds the reference, makes the
inputs from fresh secret seeds and keeps the expected outputs, so the candidate never sees them.
"""

from __future__ import annotations

import secrets
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kforge.backends import is_device_fault

from .context import Progress, ToolContext, no_progress
from .gpus import on_one_gpu
from .models import CompileResult, JobSpec, TrialReport, VerifyResult, WeightSync
from .process.protocol import EvidenceRequest, TrialVerdict
from .process.runner import WorkerDied, WorkerGroup, WorkerProcess
from .static_scan import scan_candidate
from .steps import (candidate_inputs, fresh_seeds, job_spec, keep_candidate, launch_once, load_candidate,
                    prepare_judge, ready_candidate, with_jit_kernels)
from .trials import concurrently, judge_trials
from .verdict import integrity_checks, static_check, verify_checks
from .warmup import start_warmup

if TYPE_CHECKING:  # the requests call these functions: their models are the one definition of the inputs
    from .requests import CompileRequest, VerifyRequest

__all__ = ["compile_kernel", "verify_against_reference"]


@on_one_gpu  # request.gpu: its workers start the device, and a reference's launch runs there
async def compile_kernel(ctx: ToolContext, request: CompileRequest, progress: Progress = no_progress) -> CompileResult:
    """Build the candidate; with a reference, also launch it once on the reference's inputs so kernels
    compiled at first launch (Triton) are built and their resources reported. Correctness is not judged."""
    backend, candidate_code, reference_code = request.backend, request.candidate_code, request.reference_code
    spec = await job_spec(ctx, "compile_kernel", backend, candidate_code, reference_code, {})
    if request.use_store and (hit := ctx.store.get_result(spec.key)):
        return CompileResult(**{**hit, "from_store": True})
    steps = 2.0 if reference_code is not None else 1.0
    await progress(0, steps, "building the candidate in a worker")
    with ctx.scratch("compile") as scratch:
        async with WorkerGroup(ctx.pool) as workers:
            worker, result = await load_candidate(workers, ctx, backend, scratch, spec, candidate_code)
            if worker is not None and reference_code is not None:
                await progress(1, steps, "launching the candidate once on the reference's inputs")
                result = await _launch_once(workers, ctx, backend, scratch, worker, result, reference_code)
            if result.ok:
                keep_candidate(workers, worker)  # for its verify
    # The store keeps it only if it depends on nothing but the code (`verdict.why_not_stored`).
    ctx.store.put_result(spec.key, "compile_kernel", result.model_dump(mode="json"))
    await progress(steps, steps, "built" if result.ok else "build failed")
    return result


async def _launch_once(workers: WorkerGroup, ctx: ToolContext, backend: str, scratch: Path, worker: WorkerProcess,
                       compiled: CompileResult, reference_code: str) -> CompileResult:
    init_seed, seeds = fresh_seeds(1)
    _, failure, prepared = await prepare_judge(workers, ctx, backend, scratch, reference_code, seeds, init_seed,
                                                exact=False)
    if failure is not None or prepared is None:
        return compiled.model_copy(update={"ok": False, "failure": failure})
    # The profile's torch.compile baseline, ahead of the verify and profile that follow a compile.
    await start_warmup(ctx, backend, reference_code, prepared.footprint_bytes)
    try:
        run = await launch_once(worker, candidate_inputs(reference_code, seeds, init_seed))
    except WorkerDied as died:
        return compiled.model_copy(update={"ok": False, "failure": died.failure})
    if run.failure is not None:
        return compiled.model_copy(update={"ok": False, "failure": run.failure})
    return with_jit_kernels(compiled, run)


@on_one_gpu  # request.gpu
async def verify_against_reference(ctx: ToolContext, request: VerifyRequest,
                                   progress: Progress = no_progress) -> VerifyResult:
    """Judge the candidate against the reference; see `kforge.tools.verdict` for every check.

    The candidate runs in a plain worker (the one its compile left, `steps.keep_candidate`, where there is one). A
    trial that hits a device fault is run again in a worker whose launches are synchronous (the backend's
    `sync_launch_env`, CUDA_LAUNCH_BLOCKING=1), where the error names the launch that faulted: only a faulting
    candidate pays for that worker, whose kind no warm worker waits in."""
    backend, reference_code, candidate_code = request.backend, request.reference_code, request.candidate_code
    options = {"trials": request.trials, "atol": request.atol, "rtol": request.rtol, "precision": request.precision}
    spec = await job_spec(ctx, "verify_against_reference", backend, candidate_code, reference_code, options)
    if request.use_store and (hit := ctx.store.get_result(spec.key)):
        return VerifyResult(**{**hit, "from_store": True})
    t0 = time.perf_counter()
    fields = await _judge(ctx, request, spec, progress)
    sync_env = (await ctx.require_backend(backend)).sync_launch_env
    if sync_env and _device_fault(fields):
        await progress(1, 4, "a device fault: running the trials again with synchronous launches to locate it")
        located = await _judge(ctx, request, spec, progress, extra_env=sync_env)
        launches = ", ".join(f"{k}={v}" for k, v in sync_env.items())
        if _device_fault(located):
            fields = {**located, "warnings": [*(located.get("warnings") or []), (
                f"a device fault: the trials ran again with synchronous launches ({launches}), so the error above "
                "names the launch that faulted")]}
        else:  # it faulted once: never correct, whatever the second run says
            fields = {**fields, "warnings": [*(fields.get("warnings") or []), (
                f"a device fault that did not happen again with synchronous launches ({launches}): a race, or a read "
                "of memory the kernel never wrote?")]}
    return _finish_verify(ctx, spec, t0, precision=request.precision, **fields)


def _device_fault(fields: dict[str, Any]) -> bool:
    failure = fields.get("failure")
    if failure is not None and failure.kind == "device_fault":
        return True
    return any(is_device_fault(t.error or "") for t in fields.get("trials") or [])


async def _judge(ctx: ToolContext, request: VerifyRequest, spec: JobSpec, progress: Progress, *,
                 extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """One run of the candidate's trials against the judge: the fields of its `VerifyResult`."""
    backend, reference_code, candidate_code = request.backend, request.reference_code, request.candidate_code
    trials, atol, rtol, precision = request.trials, request.atol, request.rtol, request.precision
    scan = static_check(scan_candidate(candidate_code, backend))
    init_seed, seeds = fresh_seeds(trials)
    steps = 4.0
    judging = {"atol": atol, "rtol": rtol, "precision": precision}
    with ctx.scratch("verify") as scratch:
        async with WorkerGroup(ctx.pool) as workers, AsyncExitStack() as stack:
            # The refills of the workers taken here start once this job is done, and the forks under way stop
            # meanwhile, except where the pool runs short (`WorkerPool.hold_forks`, light).
            stack.callback(ctx.hold_forks(light=True))
            await progress(0, steps, "running the reference in the judge worker while the candidate builds")
            (judge, failure, prepared), (worker, compiled, setup, cand_failure) = await concurrently(
                lambda: prepare_judge(workers, ctx, backend, scratch, reference_code, seeds, init_seed),
                lambda: ready_candidate(workers, ctx, backend, scratch, spec, candidate_code,
                                         candidate_inputs(reference_code, seeds, init_seed), extra_env=extra_env))
            ctx.pause_forks(light=True)
            if failure is not None:
                return dict(failure=failure, checks=[scan])
            await progress(1, steps, "built the candidate")
            if worker is None:
                return dict(compile=compiled, failure=cand_failure, checks=[scan])
            if not extra_env:  # a profile likely follows: its torch.compile baseline compiles beside these trials
                await start_warmup(ctx, backend, reference_code, prepared.footprint_bytes)
            await progress(2, steps, f"running {trials} trials of the candidate, each twice, one at a time, each "
                                     "compared with the reference before the next")
            # Each trial runs twice: hung after 20x the reference's time for as many calls (at least the floor).
            deadline, why = ctx.limits.hang_deadline(prepared.reference_call_s, 2)
            async def judged(i: int) -> None:
                await progress(2 + (i + 1) / (trials + 1), steps, f"trial {i + 1} of {trials} compared with the reference")

            # Beside other jobs' trials, never beside a timing on the device: its kernels would be in the timing.
            async with ctx.device_use(ctx.device_key(await ctx.require_backend(backend))).run():
                outcome, failure = await judge_trials(judge, worker, prepared, trials, judging=judging,
                                                      decoy_shift=1 + secrets.randbelow(2**30), deadline=deadline,
                                                      why=why, on_trial=judged)
                if failure is not None:
                    return dict(compile=compiled, failure=failure, checks=[scan])
                try:
                    evidence = await worker.call(EvidenceRequest(custom_work=True), stage="forward")
                except WorkerDied as died:
                    return dict(compile=compiled, failure=died.failure, checks=[scan])
            compiled = with_jit_kernels(compiled, evidence)
            run_checks = [scan] + integrity_checks(evidence.integrity, precision)
            if all(outcome.failures):  # every trial raised: report the first as the failure
                return dict(compile=compiled, failure=outcome.failures[0], checks=run_checks)
            await progress(3, steps, "gathered the evidence beside the outputs")
            reports = [_trial_report(i, seeds[i], t) for i, t in enumerate(outcome.trials)]
            tolerances = {c.tolerance.dtype: c.tolerance for r in reports for c in r.outputs if c.tolerance}
            assert setup is not None and setup.weights is not None  # a candidate that was set up (`steps.ready_candidate`)
            weights = setup.weights
            judged_how = {"notes": outcome.notes, "exact": outcome.exact, "exact_note": outcome.exact_note}
            checks = run_checks + verify_checks(reports, outcome.trials, judged_how, outcome.nulls, evidence.custom_work,
                                                precision, outcome.decoy)
            if _correct(None, reports, checks):
                keep_candidate(workers, worker)  # for its profile
    if not extra_env and _correct(None, reports, checks):  # its workers are gone: a large problem's warm-up now
        await start_warmup(ctx, backend, reference_code, prepared.footprint_bytes, after_job=True)
    avail = await ctx.require_backend(backend)
    if not extra_env:
        ctx.measure_facts_ahead(avail)  # the device's ceilings, for the profile that likely follows
    warnings = _verify_warnings(reports, weights) + ctx.sandbox_warnings()
    if avail.mode:
        warnings.append(f"ran in {avail.mode} mode: {avail.reason}")
    await progress(steps, steps, "done")
    return dict(compile=compiled, trials=reports, tolerances=list(tolerances.values()), weights=weights,
                warnings=warnings, checks=checks)


def _trial_report(i: int, seed: int, trial: TrialVerdict) -> TrialReport:
    ok = trial.error is None and bool(trial.checks) and all(c.correct for c in trial.checks)
    return TrialReport(trial=i, seed=seed, correct=ok, outputs=trial.checks, error=trial.error,
                       distribution=trial.distribution)


def _verify_warnings(reports: list[TrialReport], weights: WeightSync) -> list[str]:
    warnings = []
    if weights.unmatched:
        warnings.append(f"{len(weights.unmatched)} reference parameter(s) had no same-named, same-shaped "
                        f"entry in ModelNew and kept ModelNew's own initialization: {', '.join(weights.unmatched[:5])}")
    return warnings


def _correct(failure: Any, trials: list[TrialReport], checks: list[Any]) -> bool:
    """The verdict: no failure, every trial (at least one) correct, and no hard check failed."""
    return (failure is None and bool(trials) and all(t.correct for t in trials)
            and not any(c.hard and c.status == "fail" for c in checks))


def _finish_verify(ctx: ToolContext, spec: JobSpec, t0: float, **fields: Any) -> VerifyResult:
    trials = fields.get("trials") or []
    failure = fields.get("failure")
    checks = fields.get("checks") or []
    correct = _correct(failure, trials, checks)
    result = VerifyResult(spec=spec, ok=failure is None, correct=correct, seconds=round(time.perf_counter() - t0, 3),
                          **fields)
    # Kept only if it depends on nothing but the code and inputs: no timeouts, crashes, failures of the
    # reference or failed environment checks (`verdict.why_not_stored`, applied by the store).
    ctx.store.put_result(spec.key, "verify_against_reference", result.model_dump(mode="json"))
    if spec.reference_sha256:
        ctx.store.record_history(reference_sha256=spec.reference_sha256, backend=spec.backend,
                                 candidate_sha256=spec.candidate_sha256, tool=spec.tool, correct=correct)
    return result
