"""A device's ceilings measured ahead (`ToolContext.measure_facts_ahead`): after a verify, a warm worker of their own
measures them in the background, so the profile that follows measures none (a new data directory's first profile
spent 0.36 s on them, an H200, s28)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from kforge.server.catalog import problem_reference
from kforge.tools.context import ToolContext
from kforge.tools.process.limits import WorkerLimits
from kforge.tools.profile import profile_kernel
from kforge.tools.requests import ProfileRequest

from .test_baseline_warmup import RELU, _lines, _ready, verify_relu

pytestmark = pytest.mark.anyio


def _measured(trace: Path) -> int:
    """How many times a worker measured (or read) the ceilings."""
    return sum(1 for line in _lines(trace) if line["role"] == "ceilings" and line["op"] == "ceilings")


async def _ahead_done(trace: Path) -> dict:
    with anyio.fail_after(150):
        while not (done := [line for line in _lines(trace) if line["op"] == "ceilings.ahead"]):
            await anyio.sleep(0.1)
    [line] = done
    return line


async def test_a_verify_measures_the_ceilings_ahead_and_the_profile_after_it_measures_none(tmp_path):
    trace = tmp_path / "trace.jsonl"
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(trace_file=str(trace)))
    ctx.facts_ahead = "all"  # the cpu backend's too ("gpu", the default, GPU backends only)
    ctx.facts_at_start = False  # measured after the verify, not while the pool warms (below)
    ctx.warm_baselines = "off"  # no warm-up taking the idle workers
    reference = problem_reference("relu")
    async with ctx.warm_workers(3) as pool:
        await _ready(pool, 3)  # the verify's judge and candidate, and the ceilings' worker
        await verify_relu(ctx, "cpu", reference)
        assert (await _ahead_done(trace))["outcome"] == "measured"
        assert _measured(trace) == 1 and ("cpu", "") in ctx._facts
        assert (tmp_path / "home" / "cache" / "ceilings").is_dir()  # stored for the next server, as a profile does
        prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference, candidate_code=RELU,
                                                        baselines=("eager",), budget_s=0.2, hardware_counters=False,
                                                        use_store=False))
        assert prof.ok, prof.failure
        assert prof.report.device.peak_bandwidth_gbs, prof.report.device  # the ceilings measured ahead
        assert _measured(trace) == 1, "the profile measured the ceilings again"
        # Known now: the next verify starts nothing.
        assert not ctx.measure_facts_ahead(await ctx.require_backend("cpu"))


async def test_a_fresh_server_measures_them_while_its_pool_warms_and_its_first_profile_measures_none(tmp_path):
    """During the agent's first turn: after the first verify they waited for its workers' refills (1.6 s of the
    first profile, level2/80 after a 10 s turn, H200, s36)."""
    trace = tmp_path / "trace.jsonl"
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(trace_file=str(trace)))
    ctx.facts_ahead = "all"
    async with ctx.warm_workers(2) as pool:
        with anyio.fail_after(150):  # no job asked (the triton backend's, its interpreter here, are measured too)
            while ("cpu", "") not in ctx._facts or ctx._facts_ahead:
                await anyio.sleep(0.1)
        assert "measured" in [line["outcome"] for line in _lines(trace) if line["op"] == "ceilings.ahead"]
        await _ready(pool, 2)
        measured = _measured(trace)
        prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=problem_reference("relu"),
                                                        candidate_code=RELU, baselines=("eager",), budget_s=0.2,
                                                        hardware_counters=False, use_store=False))
        assert prof.ok, prof.failure
        assert prof.report.device.peak_bandwidth_gbs and _measured(trace) == measured  # none again


async def test_a_job_before_the_pool_is_warm_goes_first_and_its_verify_measures_them(tmp_path):
    trace = tmp_path / "trace.jsonl"
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(trace_file=str(trace)))
    ctx.facts_ahead = "all"
    ctx.warm_baselines = "off"
    async with ctx.warm_workers(2) as pool:
        await verify_relu(ctx, "cpu", problem_reference("relu"))  # sent at once: it takes the pool's first forks
        assert (await _ahead_done(trace))["outcome"] == "measured"
        ahead = [line for line in _lines(trace) if line["op"] == "ceilings.ahead"]
        trials = [line["at"] for line in _lines(trace) if line["role"] == "candidate" and line["op"] == "trial"]
        assert len(ahead) == 1 and trials and ahead[0]["at"] > max(trials), "measured beside the job, not after it"


async def test_the_default_measures_gpu_backends_only_and_never_starts_a_cold_worker(tmp_path):
    trace = tmp_path / "trace.jsonl"
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(trace_file=str(trace)))
    assert ctx.facts_ahead == "gpu"
    async with ctx.warm_workers(0):
        cpu = await ctx.require_backend("cpu")
        assert not ctx.measure_facts_ahead(cpu)  # a CPU backend's cores run its trials
        ctx.facts_ahead = "all"
        assert ctx.measure_facts_ahead(cpu)
        assert not ctx.measure_facts_ahead(cpu), "measured twice at once"
        # No warm worker idle (a pool of 0): it gives up at once, and no worker was started for it.
        assert "NoIdleWorker" in (await _ahead_done(trace))["outcome"]
        assert _measured(trace) == 0 and ("cpu", "") not in ctx._facts
