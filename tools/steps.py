"""The steps compile_kernel, verify_against_reference and profile_kernel share: a job's spec, its secret seeds,
the judge's preparation of the reference, the candidate's build and its setup with the reference's weights, and a
single launch that compiles first-launch kernels (`evaluate.py`, `profile.py`)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from .context import ToolContext
from .gpus import current as current_gpu
from .gpus import pin_key
from .models import BuildInfo, CompileResult, Diagnostic, Failure, JobSpec, sha256_text
from .process.protocol import (EvidenceReply, EvidenceRequest, LoadReply, LoadRequest, PrepareReply, PrepareRequest,
                               SetupReply, SetupRequest, TrialRequest)
from .process.runner import WorkerDied, WorkerGroup, WorkerProcess
from .trials import as_reference_failure

__all__ = ["candidate_inputs", "compile_result", "fresh_seeds", "job_spec", "keep_candidate", "kept_key", "launch_once",
           "load_candidate", "prepare_judge", "ready_candidate", "start_worker", "warm_key", "with_jit_kernels"]


async def job_spec(ctx: ToolContext, tool: str, backend: str, candidate: str, reference: str | None,
                options: dict[str, Any]) -> JobSpec:
    return JobSpec(tool=tool, backend=backend, candidate_sha256=sha256_text(candidate),
                   reference_sha256=sha256_text(reference) if reference is not None else None,
                   options=options, environment=await ctx.environment(backend),
                   gpu=placement.gpu if (placement := current_gpu()) else None)


def compile_result(spec: JobSpec, reply: LoadReply | None, failure: Failure | None) -> CompileResult:
    reply = reply or LoadReply(failure=failure)
    builds: list[BuildInfo] = list(reply.builds)
    diagnostics: list[Diagnostic] = list(reply.diagnostics)
    failure = failure or reply.failure
    if failure is not None and failure.diagnostics:
        known = {(d.message, d.origin) for d in diagnostics}
        diagnostics = [d for d in failure.diagnostics if (d.message, d.origin) not in known] + diagnostics
    diagnostics.sort(key=lambda d: d.severity != "error")
    return CompileResult(spec=spec, ok=failure is None, build_seconds=round(sum(b.seconds for b in builds), 3),
                         load_seconds=round(reply.seconds, 3),
                         from_cache=bool(builds) and all(b.from_cache for b in builds), builds=builds,
                         diagnostics=diagnostics, failure=failure)


async def start_worker(workers: WorkerGroup, ctx: ToolContext, backend: str, scratch: Path, role: str,
                 extra_env: dict[str, str] | None = None) -> WorkerProcess:
    return await workers.start(ctx.worker(backend, scratch / role, role, extra_env=extra_env))


def kept_key(role: str, backend: str, code: str) -> tuple[str, ...]:
    """Whose kept worker may serve a job (`WorkerPool.take_kept`): the same role, backend, GPU and code."""
    return role, backend, pin_key(current_gpu()), sha256_text(code)


def warm_key(backend: str, reference: str) -> tuple[str, ...]:
    """Where a judge that compiled the reference's torch.compile baseline ahead is kept (`kforge.tools.warmup`): a
    judge's key, its code marked as compiled, so a profile that wants the baseline finds that one first."""
    role, backend, pin, sha = kept_key("judge", backend, reference)
    return role, backend, pin, sha + "+torch.compile"


def keep_candidate(workers: WorkerGroup, worker: WorkerProcess | None) -> None:
    """Offer the candidate's process to the next job of the same code (compile, then verify, then profile of one
    candidate): called only after a job the candidate passed, so a process that failed a check is never kept."""
    if worker is not None and worker.kept_key is not None:
        workers.give_back(worker, worker.kept_key)


def _already_loaded(reply: LoadReply) -> LoadReply:
    """A kept candidate's load, as the next job of its code reports it: nothing was built or loaded for this job (each
    build reads as reused, in no time)."""
    return reply.model_copy(update={"seconds": 0.0, "builds": [b.model_copy(update={"from_cache": True, "seconds": 0.0})
                                                                for b in reply.builds]})


async def load_candidate(workers: WorkerGroup, ctx: ToolContext, backend: str, scratch: Path, spec: JobSpec,
                          code: str, *, extra_env: dict[str, str] | None = None) -> tuple[WorkerProcess | None, CompileResult]:
    """The candidate's process with its module loaded (built and imported): one an earlier job of the same code kept
    (`keep_candidate`; it reports that job's build), else a new one. A worker of a kind of its own (`extra_env`:
    synchronous launches) is never kept."""
    key = None if extra_env else kept_key("candidate", backend, code)
    kept = await ctx.pool.take_kept(key) if key is not None and ctx.pool is not None else None
    try:
        if kept is not None:  # a kept candidate was loaded by a job of this code (`loaded` set below)
            worker, reply = workers.adopt(kept, scratch / "candidate"), _already_loaded(kept.loaded)
        else:
            worker = await start_worker(workers, ctx, backend, scratch, "candidate", extra_env)
            reply = await worker.call(LoadRequest(role="candidate", source=code), stage="load")
    except WorkerDied as died:
        return None, compile_result(spec, None, died.failure)
    result = compile_result(spec, reply, None)
    worker.kernel_names = reply.kernel_names  # the candidate's own kernels, for profilers
    worker.loaded, worker.kept_key = reply, key
    return (worker if result.ok else None), result


async def ready_candidate(workers: WorkerGroup, ctx: ToolContext, backend: str, scratch: Path, spec: JobSpec,
                           code: str, inputs: SetupRequest, *, extra_env: dict[str, str] | None = None,
                           ) -> tuple[WorkerProcess | None, CompileResult, SetupReply | None, Failure | None]:
    """Build the candidate, then its ModelNew with the reference's initial weights (`setup`): the worker, the
    build, the setup's reply, and the failure that stopped it. `inputs` are seeds and the reference's source,
    known before the judge ran anything, so this runs beside the judge's preparation; the seeds reach the
    candidate's process only after its module was imported."""
    worker, compiled = await load_candidate(workers, ctx, backend, scratch, spec, code, extra_env=extra_env)
    if worker is None:
        return None, compiled, None, compiled.failure
    try:
        setup = await worker.call(inputs, stage="init")
    except WorkerDied as died:
        return None, compiled, None, died.failure
    if setup.failure is not None:
        return None, compiled, setup, setup.failure
    return worker, compiled, setup, None


async def prepare_judge(workers: WorkerGroup, ctx: ToolContext, backend: str, scratch: Path, reference: str,
                         seeds: list[int], init_seed: int, *, exact: bool = True, variants: bool = True,
                         compiled: bool = False) -> tuple[WorkerProcess | None, Failure | None, PrepareReply | None]:
    """Start the judge, build the reference and make trial 0's expected outputs; return the judge and what it
    prepared, or the reference's failure. `compiled`: the job times torch.compile, so a judge that compiled it
    ahead (`kforge.tools.warmup`) is taken first, once a warm-up of it under way on this GPU has ended."""
    # A judge kept by an earlier job of this reference on this GPU has it loaded already (`WorkerPool.take_kept`).
    key = kept_key("judge", backend, reference)
    kept = None
    warmed = warm_key(backend, reference)
    _give_way(ctx, keep=warmed if compiled else None)
    if ctx.pool is not None and compiled:
        if (under_way := ctx.warmups.get(warmed)) is not None:
            if under_way.compiling:
                under_way.wanted = True  # one warmed after its verify stops timing ahead: this job times it
                await under_way.done.wait()
            else:  # still waiting for a worker: this job compiles itself, sooner, and no compile runs beside it
                under_way.scope.cancel()
        kept = await ctx.pool.take_kept(warmed)
    if ctx.pool is not None and kept is None:
        kept = await ctx.pool.take_kept(key)
    try:
        if kept is not None:
            judge = workers.adopt(kept, scratch / "judge")
        else:
            judge = await start_worker(workers, ctx, backend, scratch, "judge")
            loaded = await judge.call(LoadRequest(role="reference", source=reference), stage="reference")
            if loaded.failure is not None:
                return None, as_reference_failure(loaded.failure), None
        prepared = await judge.call(PrepareRequest(init_seed=init_seed, seeds=seeds, exact=exact, variants=variants),
                                    stage="reference")
        if prepared.failure is not None:
            return None, as_reference_failure(prepared.failure), None
    except WorkerDied as died:
        return None, as_reference_failure(died.failure), None
    workers.give_back(judge, key)  # for the next job of this reference, if this one ends well
    return judge, None, prepared


def _give_way(ctx: ToolContext, keep: tuple[str, ...] | None) -> None:
    """End the warm-ups of large problems (`Warmup.after_job`) on this job's GPU, except `keep` (the one a profile of
    its reference takes): each holds a judge of ~3x its problem that this job's own processes would have beside them."""
    pin = pin_key(current_gpu())
    for warmed, warmup in ctx.warmups.items():
        if warmup.after_job and warmed[2] == pin and warmed != keep:
            warmup.scope.cancel()


def candidate_inputs(reference: str, seeds: list[int], init_seed: int) -> SetupRequest:
    """What a candidate's process needs to make the judge's inputs and initial weights itself (see `setup`)."""
    return SetupRequest(reference_source=reference, init_seed=init_seed, seeds=seeds)


def fresh_seeds(n: int) -> tuple[int, list[int]]:
    """Secret seeds: drawn by the server per request, unknown to the candidate until it has run."""
    return secrets.randbits(31), [secrets.randbits(31) for _ in range(n)]


def with_jit_kernels(compiled: CompileResult, run: EvidenceReply) -> CompileResult:
    """The compile result plus the kernels compiled at first launch during `run` (Triton)."""
    if not run.jit_kernels:
        return compiled
    return compiled.model_copy(update={"jit_kernels": list(run.jit_kernels)})


async def launch_once(worker: WorkerProcess, inputs: SetupRequest, timeout_s: float | None = None) -> EvidenceReply:
    """Build ModelNew with the reference's weights and run it once on trial 0's inputs, keeping nothing: its
    first-launch kernels get compiled (and profiled, under ncu). The reply: a failure, or `jit_kernels`."""
    setup = await worker.call(inputs, stage="init", timeout_s=timeout_s)
    if setup.failure is not None:
        return EvidenceReply(failure=setup.failure)
    trial = await worker.call(TrialRequest(i=0, repeat=False, share=False), stage="forward", timeout_s=timeout_s)
    if trial.failure is not None:
        return EvidenceReply(failure=trial.failure)
    return await worker.call(EvidenceRequest(custom_work=False), stage="forward")
