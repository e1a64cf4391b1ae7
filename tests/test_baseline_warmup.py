"""A problem's torch.compile baseline compiled ahead (`kforge.tools.warmup`): beside a new problem's first verify, a
judge of its own compiles the reference with torch.compile and is kept; the profile that follows at once waits for
it and times its torch.compile rounds in that judge, with verdicts and numbers of its own."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from kforge.server.catalog import problem_reference
from kforge.tools.context import ToolContext
from kforge.tools.evaluate import verify_against_reference
from kforge.tools.process.limits import WorkerLimits
from kforge.tools.profile import profile_kernel
from kforge.tools.requests import ProfileRequest, VerifyRequest
from kforge.tools.steps import warm_key
from kforge.tools.warmup import Warmup, start_warmup, warmed_beside

pytestmark = pytest.mark.anyio

RELU = (Path(__file__).parent / "candidates" / "relu_python.py").read_text()


def _lines(trace: Path) -> list[dict]:
    return [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []


async def verify_relu(ctx, backend: str, reference: str) -> None:
    """The problem's first verify, of an honest ReLU: what starts its warm-up."""
    verified = await verify_against_reference(ctx, VerifyRequest(backend=backend, reference_code=reference,
                                                                 candidate_code=RELU, use_store=False))
    assert verified.correct, str(verified)


async def _ready(pool, n: int) -> None:
    with anyio.fail_after(150):
        while sum(len(v) for v in pool._idle.values()) < n:
            await anyio.sleep(0.1)


async def test_the_first_profile_of_a_problem_times_torch_compile_in_the_judge_that_compiled_it_beside_the_verify(
        tmp_path):
    trace = tmp_path / "trace.jsonl"
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(trace_file=str(trace)))
    ctx.warm_baselines = "all"  # the cpu backend's too ("gpu", the default, warms GPU backends only; "off" none)
    ctx.warm_timing = False  # the compile alone, which the profile takes over at once (timed: the next test)
    reference = problem_reference("relu")
    async with ctx.warm_workers(3) as pool:
        # The verify's judge and candidate, and the warm-up's judge: idle from the start (with 2, the warm-up waits for
        # the refill the verify's takes start, which a busy 2-core VM readied after the profile had begun).
        await _ready(pool, 3)
        await verify_relu(ctx, "cpu", reference)
        warmups = [line for line in _lines(trace) if line["op"] == "warmup.torch_compile"]
        assert warmups or warm_key("cpu", reference) in ctx.warmups, "no warm-up started beside the verify"
        # At once, as an agent does: the profile waits for the warm-up still compiling, then takes its judge.
        prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference, candidate_code=RELU,
                                                        baselines=("eager", "torch.compile"), budget_s=0.3,
                                                        hardware_counters=False, use_store=False))
        assert prof.ok and prof.output_correct, prof.failure
        assert {b.name for b in prof.report.baselines if b.timing is not None} == {"eager", "torch.compile"}
        assert not ctx.warmups and not pool.has_kept(warm_key("cpu", reference)), "the warmed judge was not taken"
        # Under its own seeds, a second warm-up does not start: a judge of the reference with it compiled is stored.
        assert not await start_warmup(ctx, "cpu", reference, 0)
    lines = _lines(trace)
    [warmup] = [line for line in lines if line["op"] == "warmup.torch_compile"]
    assert warmup["outcome"] == "kept", warmup
    times = [line for line in lines if line["role"] == "judge" and line["op"] == "time"]
    warm_pid = times[0]["pid"]  # the verify times nothing: the first judge's timing is the warm-up's compile
    profile_pids = {line["pid"] for line in times[1:]}
    assert profile_pids == {warm_pid}, (warm_pid, profile_pids)


def _timed_warm_ctx(tmp_path: Path) -> tuple[ToolContext, Path]:
    """A server that warms the cpu backend's torch.compile and times it ahead with its default budget (0.3 s), and
    its trace."""
    trace = tmp_path / "trace.jsonl"
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(trace_file=str(trace)))
    ctx.warm_baselines, ctx.warm_timing, ctx.timing_budget_s = "all", True, 0.3
    return ctx, trace


async def test_gpu_the_default_warms_gpu_backends_only_and_never_without_a_pool(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    assert ctx.warm_baselines == "gpu" and ctx.warm_timing  # the defaults
    assert not await start_warmup(ctx, "cpu", problem_reference("relu"), 0)  # no pool: no kept judge to hand on
    async with ctx.warm_workers(0):
        assert not await start_warmup(ctx, "cpu", problem_reference("relu"), 0)  # a CPU backend's cores run its trials
        ctx.warm_baselines = "all"
        assert await start_warmup(ctx, "cpu", problem_reference("relu"), 0)
        with anyio.fail_after(60):
            while ctx.warmups:  # no warm worker idle (a pool of 0): it gives up at once, forking nothing
                await anyio.sleep(0.05)


async def test_a_profile_does_not_wait_for_a_warm_up_still_without_a_worker_and_a_large_problem_is_not_warmed(tmp_path):
    """A warm-up that has no judge yet is cancelled by the profile it was for, which compiles itself at once (no
    compile runs beside it later); one of a problem over the size limit never starts (its judge would not be kept)."""
    ctx = ToolContext(home=tmp_path / "home")
    ctx.warm_baselines = "all"
    reference = problem_reference("relu")
    async with ctx.warm_workers(1):
        assert not await start_warmup(ctx, "cpu", reference, 2**40)
        assert not ctx.warmups
        waiting = ctx.warmups[warm_key("cpu", reference)] = Warmup()  # as one waiting for an idle worker
        with anyio.fail_after(300):  # it would wait forever for `done`
            prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference,
                                                            candidate_code=RELU, baselines=("eager", "torch.compile"),
                                                            budget_s=0.3, hardware_counters=False, use_store=False))
        assert prof.ok and prof.output_correct, prof.failure
        assert waiting.scope.cancel_called and not waiting.done.is_set()


async def test_a_timed_warm_up_stores_the_baseline_and_the_next_profile_times_only_eager_and_the_candidate(tmp_path,
                                                                                                          monkeypatch):
    """`warm_timing`: once its compile is done, the warm-up times torch.compile and eager (its canary) alone on the
    device, with the server's default budget; the profile with that budget reuses torch.compile (and says how old it
    is) while eager still agrees, timing only eager and the candidate. With another budget it times its own."""
    # Whether eager still agrees within 2% is the canary's call, which a busy 2-core VM's noise decides either way
    # (test_e2e_stdio checks it both ways): here it always agrees, so what is checked is what the warm-up stored.
    monkeypatch.setattr("kforge.tools.profile._CANARY_TOLERANCE", 100.0)
    ctx, trace = _timed_warm_ctx(tmp_path)
    reference = problem_reference("relu")
    async with ctx.warm_workers(3) as pool:
        await _ready(pool, 3)
        await verify_relu(ctx, "cpu", reference)
        with anyio.fail_after(300):  # an agent's turn: the warm-up compiles and times meanwhile
            while ctx.warmups:
                await anyio.sleep(0.1)
        [warmup] = [line for line in _lines(trace) if line["op"] == "warmup.torch_compile"]
        assert warmup["outcome"] == "kept, timed", warmup
        before = len([line for line in _lines(trace) if line["role"] == "judge" and line["op"] == "time"])

        async def profile(budget_s: float):
            prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference, candidate_code=RELU,
                                                            baselines=("eager", "torch.compile"), budget_s=budget_s,
                                                            hardware_counters=False, use_store=False))
            assert prof.ok and prof.output_correct, prof.failure
            return {b.name: b for b in prof.report.baselines}

        reused = await profile(0.3)
        compiled = reused["torch.compile"]
        assert compiled.timing is not None and compiled.reused_after_s is not None, compiled
        assert reused["eager"].reused_after_s is None  # the canary is timed in every profile
        judge_times = [line for line in _lines(trace) if line["role"] == "judge" and line["op"] == "time"][before:]
        assert judge_times and len(judge_times) <= 5, judge_times  # eager's rounds only (3, or 5 for a short call)
        assert (await profile(0.4))["torch.compile"].reused_after_s is None  # another budget: timed in its own run


def _warm_ups(trace: Path) -> list[dict]:
    return [line for line in _lines(trace) if line["op"] == "warmup.torch_compile"]


def _large_problem_ctx(tmp_path: Path, monkeypatch) -> tuple[ToolContext, Path]:
    """A server whose ReLU problem counts as large: it is warmed after its verify, never beside it."""
    monkeypatch.setattr("kforge.tools.warmup._BESIDE_MAX_FOOTPRINT", 0)
    return _timed_warm_ctx(tmp_path)


async def _warmed_after_verify(ctx, backend: str, reference: str) -> Warmup:
    """Verify the problem's first candidate; the one warm-up it started, as it ended."""
    await verify_relu(ctx, backend, reference)
    [warmup] = ctx.warmups.values()
    return warmup


async def _compiling(warmup: Warmup) -> None:
    """Until the warm-up has its judge (a profile from then on waits for it and takes that judge)."""
    with anyio.fail_after(300):
        while not warmup.compiling:
            await anyio.sleep(0.05)


async def _profile_relu(ctx, reference: str):
    prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference, candidate_code=RELU,
                                                    baselines=("eager", "torch.compile"), budget_s=0.3,
                                                    hardware_counters=False, use_store=False))
    assert prof.ok and prof.output_correct, prof.failure
    return {b.name: b for b in prof.report.baselines}


def test_a_mid_size_problem_is_warmed_beside_its_verify_where_it_is_small_beside_the_device():
    """KernelBench's Conv2d+BatchNorm (0.79 GB) and Conv2d+InstanceNorm (1.58 GB) are warmed beside their verify on an
    H100 or H200 (their first profile at once then answers without waiting for the compile); its 9.6 GB Conv2d is warmed
    after it, as is a problem over 1/32 of a smaller device's memory."""
    gb, h100, h200 = 10**9, 80 * 2**30, 141 * 10**9
    for device in (h100, h200):
        assert warmed_beside(int(0.79 * gb), device) and warmed_beside(int(1.58 * gb), device)
        assert not warmed_beside(int(9.63 * gb), device) and not warmed_beside(int(2.2 * gb), device)
    assert warmed_beside(0, h100) and warmed_beside(None, h100)
    assert not warmed_beside(int(0.79 * gb), 16 * 2**30)  # 1/32 of 16 GiB is 512 MiB
    assert warmed_beside(int(0.79 * gb), None) and not warmed_beside(int(2.2 * gb), None)  # memory not said: 2 GiB


async def test_a_large_problem_is_warmed_after_its_verify_and_its_profile_takes_the_baseline_timed_ahead(
        tmp_path, monkeypatch):
    """Beside a job a large problem's warm-up would add a third process of ~3x the problem: it starts once the verify's
    workers are gone, times torch.compile ahead, and the profile reuses that baseline."""
    monkeypatch.setattr("kforge.tools.profile._CANARY_TOLERANCE", 100.0)  # as in the test above: the canary agrees
    ctx, trace = _large_problem_ctx(tmp_path, monkeypatch)
    reference = problem_reference("relu")
    async with ctx.warm_workers(3) as pool:
        await _ready(pool, 3)
        assert not await start_warmup(ctx, "cpu", reference, 1)  # beside a job: too large
        assert not ctx.warmups
        warmup = await _warmed_after_verify(ctx, "cpu", reference)  # started after its trials, as it ended
        assert warmup.after_job and not _warm_ups(trace)
        with anyio.fail_after(300):  # an agent's turn
            await warmup.done.wait()
        [line] = _warm_ups(trace)
        assert line["outcome"] == "kept, timed", line
        compiled = (await _profile_relu(ctx, reference))["torch.compile"]
        assert compiled.timing is not None and compiled.reused_after_s is not None, compiled


async def test_a_profile_that_comes_during_a_large_problems_warm_up_stops_its_timing_and_takes_its_judge(
        tmp_path, monkeypatch):
    """The profile came before the turn covered the compile and the timing ahead: the warm-up times nothing more
    once its compile is done, and the profile times torch.compile in its own rounds in that judge, which compiled it."""
    ctx, trace = _large_problem_ctx(tmp_path, monkeypatch)
    reference = problem_reference("relu")
    async with ctx.warm_workers(3) as pool:
        await _ready(pool, 3)
        await _compiling(await _warmed_after_verify(ctx, "cpu", reference))
        baselines = await _profile_relu(ctx, reference)  # at once: it waits for the compile
        [line] = _warm_ups(trace)
        assert line["outcome"] == "kept, its profile came", line
        compiled = baselines["torch.compile"]
        assert compiled.timing is not None and compiled.reused_after_s is None, compiled  # timed in the profile
        judge_times = [t for t in _lines(trace) if t["role"] == "judge" and t["op"] == "time"]
        warm_pid = judge_times[0]["pid"]  # the warm-up's compile, its first timed call
        assert sum(t["pid"] == warm_pid for t in judge_times) > 1  # ... and the profile's rounds in that judge
        assert len(judge_times) <= 1 + 2 * 5, judge_times  # nothing timed ahead: the profile's eager and compile rounds


async def test_another_job_ends_a_large_problems_warm_up(tmp_path, monkeypatch):
    """A large problem's warm-up gives way: the next verify (another candidate) would have a judge of ~3x the
    problem beside its own two processes."""
    ctx, trace = _large_problem_ctx(tmp_path, monkeypatch)
    reference = problem_reference("relu")
    async with ctx.warm_workers(3) as pool:
        await _ready(pool, 3)
        warmup = await _warmed_after_verify(ctx, "cpu", reference)
        again = await verify_against_reference(ctx, VerifyRequest(
            backend="cpu", reference_code=reference, candidate_code=RELU + "\n# another candidate\n", use_store=False))
        assert again.correct, str(again)
        assert warmup.scope.cancel_called
        with anyio.fail_after(60):
            await warmup.done.wait()
        assert _warm_ups(trace)[0]["outcome"] == "cancelled", _warm_ups(trace)


async def test_a_profile_during_the_warm_up_answers_at_once_and_its_torch_compile_is_added_once_timed(tmp_path,
                                                                                                     monkeypatch):
    """`late_baselines` (the default): a profile that comes while the warm-up compiles does not wait for the compile.
    It times eager and the candidate, answers with torch.compile pending, and the warm-up's baseline, timed ahead once
    compiled, is added to the stored profile against this profile's candidate (its eager the canary). The compile ran
    as a `precompile` op, outside the device's use, so the profile's timing did not wait for it."""
    monkeypatch.setattr("kforge.tools.profile._CANARY_TOLERANCE", 100.0)  # the canary agrees (as above)
    ctx, trace = _timed_warm_ctx(tmp_path)
    reference = problem_reference("relu")
    async with ctx.warm_workers(3) as pool:
        await _ready(pool, 3)
        await verify_relu(ctx, "cpu", reference)
        warmup = ctx.warmups.get(warm_key("cpu", reference))
        assert warmup is not None, "no warm-up started beside the verify"
        prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference, candidate_code=RELU,
                                                        baselines=("eager", "torch.compile"), budget_s=0.3,
                                                        hardware_counters=False, use_store=False))
        assert prof.ok and prof.output_correct, prof.failure
        answered = {b.name: b for b in prof.report.baselines}
        assert answered["eager"].timing is not None
        pending = answered["torch.compile"]
        assert pending.timing is None and pending.pending and f"kforge://profiles/{prof.profile_id}" in pending.pending
        assert not warmup.done.is_set(), "the profile waited for the warm-up"
        assert "torch.compile: compiling ahead" in str(prof)
        with anyio.fail_after(300):  # the warm-up compiles and times; the profile is completed after it
            await warmup.done.wait()
            while not [line for line in _lines(trace) if line["op"] == "profile.late_baseline"]:
                await anyio.sleep(0.1)
    [warm] = _warm_ups(trace)
    assert warm["outcome"] == "kept, timed" and warm["precompile"] == "held back", warm
    [late] = [line for line in _lines(trace) if line["op"] == "profile.late_baseline"]
    assert late["outcome"] == "added", late
    stored = ctx.store.get_profile(prof.profile_id)
    compiled = {b["name"]: b for b in stored["report"]["baselines"]}["torch.compile"]
    assert compiled["timing"] is not None and compiled["pending"] is None and compiled["added_after_s"] >= 0, compiled
    assert compiled["speedup"] > 0 and compiled["speedup_ci"][0] <= compiled["speedup"] <= compiled["speedup_ci"][1]
    [entry] = [h for h in ctx.store.history(prof.spec.reference_sha256) if h["profile_id"] == prof.profile_id]
    assert entry["speedup_compile"] == compiled["speedup"]
    # The compile held the device for none of its seconds: the profile's timing ran while it compiled.
    lines = _lines(trace)
    [precompile] = [line for line in lines if line["role"] == "judge" and line["op"] == "precompile"]
    candidate_times = [line for line in lines if line["role"] == "candidate" and line["op"] == "time"]
    assert any(precompile["at"] < t["at"] < precompile["at"] + precompile["s"] for t in candidate_times), \
        (precompile, candidate_times)


async def test_late_baselines_off_waits_for_the_warm_up(tmp_path, monkeypatch):
    """`late_baselines=False`: the profile waits for the warm-up's compile and answers with torch.compile timed."""
    monkeypatch.setattr("kforge.tools.profile._CANARY_TOLERANCE", 100.0)
    ctx, _ = _timed_warm_ctx(tmp_path)
    reference = problem_reference("relu")
    async with ctx.warm_workers(3) as pool:
        await _ready(pool, 3)
        await verify_relu(ctx, "cpu", reference)
        assert warm_key("cpu", reference) in ctx.warmups
        prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference, candidate_code=RELU,
                                                        baselines=("eager", "torch.compile"), budget_s=0.3,
                                                        hardware_counters=False, use_store=False, late_baselines=False))
        assert prof.ok and prof.output_correct, prof.failure
        compiled = {b.name: b for b in prof.report.baselines}["torch.compile"]
        assert compiled.timing is not None and compiled.pending is None, compiled
