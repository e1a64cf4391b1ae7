"""Correctness trials, one at a time, between the judge and the candidate's worker (server side).

For each trial the judge makes the inputs from the trial's secret seed and the expected outputs; the
candidate's worker makes the same inputs from the same seed, runs ModelNew and holds its outputs; the
judge reads them in place (`kforge.tools.harness.handoff`), and the candidate lets them go. Only one trial's
inputs and outputs exist at a time in either process, so a problem of several GB is judged in about
three times its own footprint, and nothing of its size is written to disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

import anyio

from .models import Failure
from .process.protocol import (CalibrateReply, CalibrateRequest, CheckDecoyRequest, CheckRepeatRequest, CheckRequest,
                               DecoyRequest, DecoyVerdict, ExpectReply, ExpectRequest, NullOutcome, PrepareReply,
                               ReleaseRequest, RepeatReply, RepeatRequest, TrialReply, TrialRequest, TrialVerdict)
from .process.runner import WorkerDied, WorkerProcess

__all__ = ["TrialsOutcome", "as_reference_failure", "concurrently", "judge_trials"]


@dataclass
class TrialsOutcome:
    trials: list[TrialVerdict] = field(default_factory=list)  # the judge's verdict per trial
    failures: list[Failure | None] = field(default_factory=list)  # the candidate's error per trial
    notes: list[str] = field(default_factory=list)
    exact: bool = False
    exact_note: str | None = None
    nulls: list[NullOutcome] = field(default_factory=list)  # over the trials so far: a null passes if it passes all
    decoy: DecoyVerdict | None = None


def as_reference_failure(failure: Failure) -> Failure:
    """A failure of the judge's worker: the reference's, not the candidate's."""
    return failure.model_copy(update={"stage": "reference",
                                      "message": f"the reference failed, not the candidate: {failure.message}"})


async def judge_trials(judge: WorkerProcess, worker: WorkerProcess, prepared: PrepareReply, count: int, *,
                       judging: dict[str, Any], repeat: bool = True, calibrate: bool = True,
                       decoy_shift: int | None = None, deadline: float | None = None, why: str = "",
                       on_trial: Callable[[int], Awaitable[None]] | None = None,
                       ) -> tuple[TrialsOutcome, Failure | None]:
    """Run `count` trials (the judge's `prepare` made trial 0's expected outputs); then the decoy call.

    Returns what was judged and, if a worker died (the candidate's: a crash or a hang past `deadline`;
    the judge's: the reference's fault), that failure."""
    outcome = TrialsOutcome()
    alive_nulls: list[str] | None = None if calibrate else []
    beside = calibrate_beside_trial(prepared)
    # A large problem's repeat runs once the judge has let go of the first outputs: both runs' outputs and the
    # expected ones took 3x the outputs at once (conv2d's 8.6 GB output at its KernelBench size).
    repeat_apart = repeat and not beside
    for i in range(count):
        try:
            expected: PrepareReply | ExpectReply = (
                prepared if i == 0 else await judge.call(ExpectRequest(i=i), stage="reference"))
        except WorkerDied as died:
            return outcome, as_reference_failure(died.failure)
        if expected.failure is not None:
            return outcome, as_reference_failure(expected.failure)
        outcome.exact = expected.exact if i == 0 else outcome.exact and expected.exact
        outcome.exact_note = expected.exact_note or outcome.exact_note
        if expected.note:
            outcome.notes.append(expected.note)
        distribution = expected.distribution

        async def trial() -> TrialReply | WorkerDied:
            return await _settle(worker.call(TrialRequest(i=i, variant=distribution, repeat=repeat and not repeat_apart),
                                             stage="forward", timeout_s=deadline, timeout_why=why))

        async def calibration() -> CalibrateReply | WorkerDied:
            return await _settle(judge.call(CalibrateRequest(i=i, nulls=alive_nulls, **judging), stage="compare"))

        if alive_nulls == []:  # every null rejected already (or calibration not asked for)
            calibration_or_died, record_or_died = None, await trial()
        elif beside:  # the judge's nulls beside the candidate's call: each process is idle while the other works
            calibration_or_died, record_or_died = await concurrently(calibration, trial)
        else:  # on a problem of several GB the two would need the device memory of both at once
            calibration_or_died = await calibration()
            if isinstance(calibration_or_died, WorkerDied):
                return outcome, as_reference_failure(calibration_or_died.failure)
            record_or_died = await trial()
        if isinstance(calibration_or_died, WorkerDied):
            return outcome, as_reference_failure(calibration_or_died.failure)
        if isinstance(record_or_died, WorkerDied):
            return outcome, record_or_died.failure
        nulls, record = calibration_or_died, record_or_died
        assert not isinstance(record, WorkerDied)
        alive_nulls = _merge_nulls(outcome, nulls) if nulls is not None else alive_nulls
        if record.error is not None or record.failure is not None:
            outcome.trials.append(TrialVerdict(error=_error_of(record), distribution=distribution))
            outcome.failures.append(record.failure)
            continue
        again: RepeatReply | None = None
        try:
            checked = await judge.call(CheckRequest(i=i, record=record, digest=repeat_apart, **judging), stage="compare")
            if checked.trial is None:  # the judge's own process failed (out of descriptors, ...): not the candidate
                return outcome, as_reference_failure(checked.failure)
            await worker.call(ReleaseRequest(), stage="forward")
            if repeat_apart:
                again = await worker.call(RepeatRequest(i=i), stage="forward", timeout_s=deadline, timeout_why=why)
                if again.error is None and again.failure is None:
                    checked.trial.repeat = (await judge.call(CheckRepeatRequest(i=i, record=again, **judging),
                                                             stage="compare")).repeat
                    await worker.call(ReleaseRequest(), stage="forward")
        except WorkerDied as died:
            return outcome, as_reference_failure(died.failure) if died.failure.stage == "compare" else died.failure
        if again is not None and (again.error is not None or again.failure is not None):
            # as when the repeat fails inside the trial's own call
            outcome.trials.append(TrialVerdict(error=_error_of(again), distribution=distribution))
            outcome.failures.append(again.failure)
            continue
        outcome.trials.append(checked.trial)
        outcome.failures.append(None)
        if on_trial is not None:
            await on_trial(i)
    try:
        if decoy_shift is not None and not any(outcome.failures):  # a failed trial already decided the verdict
            decoy = await worker.call(DecoyRequest(shift=decoy_shift), stage="forward", timeout_s=deadline,
                                      timeout_why=why)
            outcome.decoy = (await judge.call(CheckDecoyRequest(record=decoy, **judging), stage="compare")).decoy
            await worker.call(ReleaseRequest(), stage="forward")
    except WorkerDied as died:
        return outcome, died.failure
    return outcome, None


# Calibration runs beside the candidate's call (and the repeat inside it) when the problem takes under this share
# of the device's memory and under `_BESIDE_MAX_BYTES`. At 1/16, MaxPool2d at its KernelBench size (4.3 GB on an
# 80 GB H100) ran beside and its verify peaked at 3.6x its footprint; small problems, where running beside saves
# the time, stay far below.
_BESIDE_SHARE = 1 / 32
# A share alone grows with the device: on a 141 GB H200, 1/32 let MaxPool2d's 4.3 GB run beside again, and its
# verify peaked at 4.75x its footprint (the judge's nulls, 9.9 GB, beside the candidate's trial, 8.9 GB: each
# forward also holds max_pool2d's int64 indices; H200, 2026-12-02). Apart, they should hold ~4x: twice the
# reference's own peak (not yet measured on a GPU).
# Under 1 GiB a CUDA context (~1.3 GB a process there) outweighs what running beside adds.
_BESIDE_MAX_BYTES = 2**30


def _error_of(record: TrialReply | RepeatReply) -> str:
    """What the candidate's call raised (a failure reported without its error line: the failure's message)."""
    if record.error is not None:
        return record.error
    assert record.failure is not None
    return record.failure.message


def calibrate_beside_trial(prepared: PrepareReply) -> bool:
    """Whether the judge's null candidates may run while the candidate's worker runs its trial: both
    processes then hold a trial's inputs and outputs at once, so only where that is small beside the device and
    small in itself (the device's memory bound is a multiple of the problem's footprint, whatever the device)."""
    footprint, capacity = prepared.footprint_bytes, prepared.capacity_bytes
    return bool(footprint is not None and capacity and footprint < min(_BESIDE_SHARE * capacity, _BESIDE_MAX_BYTES))


async def _settle(call: Awaitable[Any]) -> Any:
    """The call's reply, or the WorkerDied it raised (so that two calls run side by side both finish)."""
    try:
        return await call
    except WorkerDied as died:
        return died


A = TypeVar("A")
B = TypeVar("B")


async def concurrently(first: Callable[[], Awaitable[A]], second: Callable[[], Awaitable[B]]) -> tuple[A, B]:
    """Run two independent steps at once (the judge's reference beside the candidate's build, its nulls beside
    a trial)."""
    results: list[Any] = [None, None]

    async def run(i: int, step: Callable[[], Awaitable[Any]]) -> None:
        results[i] = await step()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, 0, first)
            tg.start_soon(run, 1, second)
    except BaseExceptionGroup as group:  # one step failed (a harness error): raise it as itself
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    return results[0], results[1]


def _merge_nulls(outcome: TrialsOutcome, verdicts: CalibrateReply) -> list[str]:
    """Fold one trial's null verdicts into the running ones (a null passes only if it passes every trial);
    the nulls still worth trying on the next trial."""
    known = {n.null: n for n in outcome.nulls}
    for v in verdicts.nulls:
        if (k := known.get(v.null)) is not None:
            applicable = k.applicable and v.applicable
            known[v.null] = k.model_copy(update={
                "applicable": applicable, "passes": applicable and k.passes and v.passes,
                "elementwise_passes": applicable and k.elementwise_passes and v.elementwise_passes,
                "note": v.note or k.note})
        else:
            known[v.null] = v.model_copy(update={"passes": v.applicable and v.passes,
                                                 "elementwise_passes": v.applicable and v.elementwise_passes})
    outcome.nulls = list(known.values())
    # Rejected on both counts, or not applicable: the other trials cannot change that.
    return [n.null for n in outcome.nulls if n.applicable and (n.passes or n.elementwise_passes)]
