"""A candidate's process kept from one job of its code to the next (`steps.keep_candidate`, `WorkerPool.take_kept`):
compile, then verify, then profile of one candidate need one process, not three (each a fork whose device context
the host starts one at a time). It serves only its own code, only after a job it passed, and is stopped while kept."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from kforge.server.catalog import problem_reference
from kforge.tools.context import ToolContext
from kforge.tools.evaluate import compile_kernel, verify_against_reference
from kforge.tools.profile import profile_kernel
from kforge.tools.requests import CompileRequest, ProfileRequest, VerifyRequest

pytestmark = pytest.mark.anyio

CANDIDATES = Path(__file__).parent / "candidates"
RELU = (CANDIDATES / "relu_python.py").read_text()
RELU_OFF = RELU.replace("torch.clamp_min(x, 0.0)", "torch.clamp_min(x, 0.0) + 1e-2")


def _kept_candidates(pool) -> list:
    return [w for key, parked in pool._kept.items() if key[0] == "candidate" for _, w in parked]


async def _kept_pid(pool, n: int) -> int:
    """The pid of the one kept candidate, once `n` were kept in all."""
    with anyio.fail_after(60):
        while pool.kept["candidate"] < n or pool._resetting:
            await anyio.sleep(0.05)
    [worker] = _kept_candidates(pool)
    return worker._proc.pid


def _state(pid: int) -> str:
    """The states of the worker's processes: it and its descendants (a sandboxed worker runs in a child of its own)."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0])
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            todo += [int(c) for c in task.read_text().split()]
    return "".join(sorted(found))


async def _verify(ctx: ToolContext, code: str):
    return await verify_against_reference(ctx, VerifyRequest(backend="cpu", reference_code=problem_reference("relu"),
                                                             candidate_code=code, use_store=False))


async def test_compile_verify_and_profile_of_one_candidate_run_in_one_process_stopped_between_jobs(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        built = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=RELU,
                                                         reference_code=problem_reference("relu"), use_store=False))
        assert built.ok, str(built)
        pid = await _kept_pid(pool, 1)
        assert _state(pid) == "T", "a kept candidate must run nothing between its jobs"
        verified = await _verify(ctx, RELU)
        assert verified.correct and pool.reused["candidate"] == 1, str(verified)
        assert verified.compile is not None and verified.compile.ok  # the kept process's build, reported again
        assert await _kept_pid(pool, 2) == pid, "the verify ran in the compile's process and gave it back"
        assert _state(pid) == "T"
        profiled = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=problem_reference("relu"),
                                                            candidate_code=RELU, use_store=False, budget_s=1.0,
                                                            hardware_counters=False))
        assert profiled.ok and profiled.output_correct, str(profiled)
        assert pool.reused["candidate"] == 2, "the profile ran in the verify's process"


async def test_a_kept_candidate_serves_only_its_own_code_and_a_failed_job_ends_it(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        assert (await _verify(ctx, RELU)).correct
        pid = await _kept_pid(pool, 1)
        # Other code (one character more) starts its own process, and failing, is not kept.
        wrong = await _verify(ctx, RELU_OFF)
        assert not wrong.correct and pool.reused["candidate"] == 0, str(wrong)
        await anyio.sleep(0.5)
        assert pool.kept["candidate"] == 1 and [w._proc.pid for w in _kept_candidates(pool)] == [pid]
        # The same code takes it back; it passes again, so it is kept again.
        assert (await _verify(ctx, RELU)).correct and pool.reused["candidate"] == 1
        assert await _kept_pid(pool, 2) == pid


async def test_a_candidate_that_leaves_a_process_running_is_not_kept(tmp_path):
    """A compile judges nothing of what the candidate's import started: a process left running there must not live on
    beside other jobs, so the pool looks before it keeps one (`WorkerProcess.background_seen`)."""
    sleeper = RELU.replace("import torch", "import subprocess\nimport torch\nsubprocess.Popen(['sleep', '60'])", 1)
    assert "Popen" in sleeper
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        built = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=sleeper, use_store=False))
        assert built.ok, str(built)
        with anyio.fail_after(60):
            while pool._resetting:
                await anyio.sleep(0.05)
        assert pool.kept["candidate"] == 0 and not _kept_candidates(pool)
        honest = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=RELU, use_store=False))
        assert honest.ok and await _kept_pid(pool, 1) > 0  # the same pool keeps an honest one
