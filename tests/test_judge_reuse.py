"""A judge kept for the next job of its reference (`WorkerPool.give_back_kept`): the next job skips a fork and the
reference's load, and still gets verdicts of its own: nothing of the earlier job's expected outputs, inputs or seeds
carries over, and a job that ends badly never leaves its judge behind."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from kforge.server.catalog import problem_reference
from kforge.tools.context import ToolContext
from kforge.tools.evaluate import compile_kernel, verify_against_reference
from kforge.tools.process.runner import WorkerGroup
from kforge.tools.requests import CompileRequest, VerifyRequest
from kforge.tools.steps import fresh_seeds, prepare_judge

pytestmark = pytest.mark.anyio

CANDIDATES = Path(__file__).parent / "candidates"
RELU = (CANDIDATES / "relu_python.py").read_text()
# The same ReLU off by a little: a judge that compared against a stale expected output could not tell it apart.
RELU_OFF = RELU.replace("torch.clamp_min(x, 0.0)", "torch.clamp_min(x, 0.0) + 1e-2")


def _kept(pool, role: str = "judge") -> list:
    return [w for key, parked in pool._kept.items() if key[0] == role for _, w in parked]


async def _wait_kept(pool, n: int) -> None:
    with anyio.fail_after(60):
        while pool.kept["judge"] < n:
            await anyio.sleep(0.05)


async def _verify(ctx: ToolContext, code: str, problem: str = "relu"):
    return await verify_against_reference(ctx, VerifyRequest(backend="cpu", reference_code=problem_reference(problem),
                                                             candidate_code=code, use_store=False))


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_the_next_job_of_a_reference_reuses_its_judge_and_still_judges_its_own_outputs(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        first = await _verify(ctx, RELU)
        assert first.correct, str(first)
        await _wait_kept(pool, 1)
        [judge] = _kept(pool)
        pid, own = judge._proc.pid, judge.scratch
        assert own.is_dir(), "the job's scratch was removed with the kept judge's directory"
        wrong = await _verify(ctx, RELU_OFF)
        assert pool.reused["judge"] == 1
        assert not wrong.correct, "a reused judge passed a wrong candidate"
        await _wait_kept(pool, 2)
        assert [j._proc.pid for j in _kept(pool)] == [pid], "the same judge process served both jobs"
        again = await _verify(ctx, RELU)
        assert again.correct and pool.reused["judge"] == 2, str(again)
        # Another reference finds no judge of its own kept: it starts one.
        other = await _verify(ctx, RELU, problem="softmax")
        assert not other.correct and pool.reused["judge"] == 2
        await _wait_kept(pool, 4)
        kept = _kept(pool)
        assert len(kept) == 2
        pids = [j._proc.pid for j in kept]
        dirs = [j.scratch for j in kept]
    # The server's end ends the judges it kept, and removes their directories.
    with anyio.fail_after(30):
        while any(_alive(p) for p in pids):
            await anyio.sleep(0.05)
    assert not any(d.exists() for d in dirs)
    assert not [p for p in (tmp_path / "home" / "jobs").iterdir()], "a job's or a judge's directory was left"


async def test_a_compile_gives_its_judge_to_the_verify_after_it(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        built = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=RELU,
                                                         reference_code=problem_reference("relu"), use_store=False))
        assert built.ok, str(built)
        await _wait_kept(pool, 1)
        result = await _verify(ctx, RELU)
        assert result.correct and pool.reused["judge"] == 1, str(result)


async def test_a_job_that_ends_in_an_exception_ends_its_judge(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    reference = problem_reference("relu")
    async with ctx.warm_workers(1) as pool:
        init_seed, seeds = fresh_seeds(2)
        with pytest.raises(RuntimeError):
            with ctx.scratch("verify") as scratch:
                async with WorkerGroup(ctx.pool) as workers:
                    judge, failure, _ = await prepare_judge(workers, ctx, "cpu", scratch, reference, seeds, init_seed)
                    assert failure is None and judge is not None and judge.warm
                    pid = judge._proc.pid
                    raise RuntimeError("the job failed")
        await anyio.sleep(0.5)
        assert pool.kept["judge"] == 0 and not _kept(pool)
        with anyio.fail_after(30):
            while _alive(pid):
                await anyio.sleep(0.05)
        # A job that ends well gives it back; one whose judge died does not.
        with ctx.scratch("verify") as scratch:
            async with WorkerGroup(ctx.pool) as workers:
                judge, failure, _ = await prepare_judge(workers, ctx, "cpu", scratch, reference, seeds, init_seed)
                os.kill(judge._proc.pid, 9)
                with anyio.fail_after(30):
                    while judge.alive:
                        await anyio.sleep(0.05)
        await anyio.sleep(0.5)
        assert pool.kept["judge"] == 0 and not _kept(pool)


async def test_a_job_right_after_another_waits_for_the_judge_still_forgetting_the_last_job(tmp_path):
    """An agent's profile follows its verify at once: the judge given back is still resetting (0.3-0.6 s on an H200
    host), and the next job waits for it rather than start another."""
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        assert (await _verify(ctx, RELU)).correct
        assert pool._resetting or pool.kept["judge"] == 1  # given back: its reset under way or done
        second = await _verify(ctx, RELU_OFF)
        assert not second.correct and pool.reused["judge"] == 1


async def test_a_kept_judges_log_starts_empty_for_the_next_job(tmp_path):
    """A reference failure quotes the tail of the judge's log: a kept judge's next job must not quote an earlier
    job's lines."""
    chatty = problem_reference("relu").replace("def forward(self, x):", "def forward(self, x):\n        print('EARLIER JOB')", 1)
    assert "EARLIER JOB" in chatty
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        result = await verify_against_reference(ctx, VerifyRequest(backend="cpu", reference_code=chatty,
                                                                   candidate_code=RELU, use_store=False))
        assert result.correct, str(result)
        await _wait_kept(pool, 1)
        [judge] = _kept(pool)
        assert judge.log.exists() and "EARLIER JOB" not in judge.log.read_text()
