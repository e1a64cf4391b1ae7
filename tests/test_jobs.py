"""The job manager's scheduling rules, with requests that only sleep (no workers): fairness, no job lost or
run twice, bounded queues, cancel, failures, shutdown and resume. The real tools run as jobs in the
end-to-end tests (test_e2e_remote.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import anyio
import pytest
from pydantic import BaseModel

from kforge.backends import Availability
from kforge.tools import jobs as jobs_module
from kforge.tools.tool_inputs import RequestError
from kforge.tools.jobs import JobManager, JobStatus
from kforge.tools.models import CompileResult, JobSpec
from kforge.tools.store import ResultStore

pytestmark = pytest.mark.anyio


class FakeTools:
    """What the job manager needs from a ToolContext: the store and backend lookup (one CPU device)."""

    def __init__(self, home):
        self.store = ResultStore(home)
        self.started: list[str] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []

    async def require_backend(self, name: str) -> Availability:
        if name != "cpu":
            raise RequestError(f"unknown backend {name!r}")
        return Availability(backend="cpu", ok=True, reason="test", device_name="test-cpu")


class SleepRequest(BaseModel):
    tool: str = "compile_kernel"
    backend: str = "cpu"
    candidate_code: str
    seconds: float = 0.05
    fail: str | None = None

    async def run(self, ctx: FakeTools, progress) -> CompileResult:
        ctx.started.append(self.candidate_code)
        await progress(0, 2, "working")
        try:
            await anyio.sleep(self.seconds)
        except anyio.get_cancelled_exc_class():
            ctx.cancelled.append(self.candidate_code)
            raise
        if self.fail == "request":
            raise RequestError("the request was bad")
        if self.fail == "bug":
            raise ZeroDivisionError("division by zero")
        await progress(2, 2, "finished")
        ctx.finished.append(self.candidate_code)
        spec = JobSpec(tool="compile_kernel", backend="cpu", candidate_sha256=self.candidate_code, options={},
                       environment={})
        return CompileResult(spec=spec, ok=True, build_seconds=0.0, load_seconds=self.seconds, from_cache=False)


async def _no_progress(done, total, message):
    return None


async def _wait_all(manager: JobManager, handles, timeout=10.0):
    with anyio.fail_after(timeout):
        return [await manager.wait(h, timeout, _no_progress) for h in handles]


async def test_a_burst_from_one_client_does_not_starve_another(tmp_path):
    tools = FakeTools(tmp_path)
    manager = JobManager(tools, parallel=1)
    async with manager.running():
        burst = [await manager.submit(SleepRequest(candidate_code=f"a{i}"), "client-a") for i in range(4)]
        late = await manager.submit(SleepRequest(candidate_code="b0"), "client-b")
        results = await _wait_all(manager, [*burst, late])
    assert all(isinstance(r, CompileResult) for r in results)
    # a0 was already running when b0 arrived; b0 goes next, ahead of a's queued jobs
    assert tools.started == ["a0", "b0", "a1", "a2", "a3"]


async def test_every_job_runs_exactly_once_and_repeats_attach(tmp_path):
    tools = FakeTools(tmp_path)
    manager = JobManager(tools, parallel=3)
    async with manager.running():
        handles = [await manager.submit(SleepRequest(candidate_code=f"c{i % 10}"), f"client-{i % 3}")
                   for i in range(30)]  # each request three times, from different clients
        assert len({h.id for h in handles}) == 10  # identical requests share one job
        results = await _wait_all(manager, handles)
    assert sorted(tools.started) == sorted(tools.finished) == [f"c{i}" for i in range(10)]
    assert [r.spec.candidate_sha256 for r in results] == [f"c{i % 10}" for i in range(30)]
    rows = tools.store.jobs(limit=100)
    assert len(rows) == 10 and {r["status"] for r in rows} == {"done"}


async def test_a_full_queue_answers_busy_with_a_retry_time(tmp_path):
    tools = FakeTools(tmp_path)
    manager = JobManager(tools, parallel=1, queue_limit=2)
    async with manager.running():
        running = await manager.submit(SleepRequest(candidate_code="long", seconds=5), "a")
        await anyio.sleep(0.05)
        queued = [await manager.submit(SleepRequest(candidate_code=f"q{i}"), "a") for i in range(2)]
        busy = await manager.submit(SleepRequest(candidate_code="one too many"), "b")
        assert isinstance(busy, JobStatus) and busy.status == "busy" and busy.job_id is None
        assert busy.retry_after_s is not None and busy.retry_after_s >= 1
        assert "2 jobs are queued for test-cpu" in busy.message and "Retry in about" in str(busy)
        status = manager.view(queued[1].id)
        assert status.status == "queued" and status.queue_position == 1
        manager.cancel(running.id)
        await _wait_all(manager, queued)
    assert "one too many" not in tools.started  # a busy answer queued nothing


async def test_cancel_stops_a_running_job_and_drops_a_queued_one(tmp_path):
    tools = FakeTools(tmp_path)
    manager = JobManager(tools, parallel=1)
    async with manager.running():
        running = await manager.submit(SleepRequest(candidate_code="slow", seconds=30), "a")
        queued = await manager.submit(SleepRequest(candidate_code="next"), "a")
        await anyio.sleep(0.05)
        assert manager.cancel(queued.id).status == "cancelled"
        manager.cancel(running.id)
        with anyio.fail_after(5):
            final = await manager.wait(running, 5, _no_progress)
        assert final.status == "cancelled" and "worker processes were killed" in final.message
        again = manager.cancel(running.id)  # cancelling a finished job says how it ended
        assert again.status == "cancelled"
    assert tools.cancelled == ["slow"] and tools.started == ["slow"]
    assert tools.store.get_job(queued.id)["status"] == "cancelled"


async def test_cancel_job_answers_cancelled_once_the_workers_are_gone(tmp_path):
    tools = FakeTools(tmp_path)
    manager = JobManager(tools, parallel=1)
    async with manager.running():
        running = await manager.submit(SleepRequest(candidate_code="slow", seconds=30), "a")
        await anyio.sleep(0.05)
        with anyio.fail_after(5):
            answer = await manager.cancel_and_wait(running.id)
        assert answer.status == "cancelled" and tools.cancelled == ["slow"]
        text = str(answer)
        assert "cancelled" in text and "is running" not in text and "Next: call compile_kernel again" in text
        stuck = await manager.submit(SleepRequest(candidate_code="stuck", seconds=30), "a")
        await anyio.sleep(0.05)
        stuck.scope = None  # as if its workers had not been reached yet: the answer says it is on its way
        assert (await manager.cancel_and_wait(stuck.id, wait_s=0.1)).status == "cancelling"
        assert "is being cancelled" in str(manager.view(stuck.id))


async def test_a_short_wait_returns_a_handle_with_progress_then_the_result(tmp_path):
    tools = FakeTools(tmp_path)
    manager = JobManager(tools, parallel=1)
    seen = []

    async def progress(done, total, message):
        seen.append((done, total, message))

    async with manager.running():
        job = await manager.submit(SleepRequest(candidate_code="x", seconds=0.5), "a")
        handle = await manager.wait(job, 0.2, progress)
        assert isinstance(handle, JobStatus) and handle.status == "running" and handle.job_id == job.id
        assert handle.progress == 0 and handle.total == 2 and "get_job" in str(handle)
        result = await manager.wait_for(job.id, 5, progress)
    assert isinstance(result, CompileResult)
    assert (0, 2, "working") in seen and seen[-1] == (2, 2, "done")  # the last step reaches the client too
    # the result is kept: a later reader (another connection, another server) gets it from the store
    assert isinstance(JobManager(tools).view(job.id), CompileResult)


class TwoStepRequest(SleepRequest):
    """Two progress messages within a second, the second one (where it runs, say) before a long step."""

    async def run(self, ctx: FakeTools, progress) -> CompileResult:
        await progress(0, 2, "starting")
        await progress(1, 2, "running on node B")
        await anyio.sleep(self.seconds)
        return await super().run(ctx, progress)


async def test_the_jobs_list_shows_a_running_jobs_progress_though_the_store_lags(tmp_path):
    """A running job's progress reaches the store at most once a second (each write is a commit on the event loop),
    so the list of recent jobs (resource kforge://jobs) reads the jobs this server runs from the jobs themselves."""
    tools = FakeTools(tmp_path)
    manager = JobManager(tools, parallel=1)
    async with manager.running():
        job = await manager.submit(TwoStepRequest(candidate_code="x", seconds=1.0), "a")
        with anyio.fail_after(5):
            while job.message != "running on node B":
                await anyio.sleep(0.01)
        assert tools.store.get_job(job.id)["message"] == "starting"  # the store's copy lags, by design
        [row] = [r for r in manager.recent() if r["job_id"] == job.id]
        assert row["status"] == "running" and row["message"] == "running on node B"
        await manager.wait(job, 10, _no_progress)
    [row] = [r for r in manager.recent() if r["job_id"] == job.id]
    assert row["status"] == "done"  # a finished job is read from the store, written whole when it ended


async def test_failures_say_what_went_wrong(tmp_path):
    tools = FakeTools(tmp_path)
    manager = JobManager(tools, parallel=2)
    async with manager.running():
        bad = await manager.submit(SleepRequest(candidate_code="r", fail="request"), "a")
        bug = await manager.submit(SleepRequest(candidate_code="b", fail="bug"), "a")
        bad_status, bug_status = await _wait_all(manager, [bad, bug])
        with pytest.raises(RequestError, match="unknown backend"):
            await manager.submit(SleepRequest(candidate_code="x", backend="nope"), "a")
        with pytest.raises(RequestError, match="no job 'missing'"):
            manager.view("missing")
    assert bad_status.status == "failed" and bad_status.error == "the request was bad"
    assert bug_status.status == "failed" and "internal error (ZeroDivisionError" in bug_status.error


async def test_a_stopping_server_leaves_its_jobs_for_the_next_one(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs_module, "parse_request", lambda data: SleepRequest(**data))
    tools = FakeTools(tmp_path)
    first = JobManager(tools, parallel=1)
    async with first.running():
        running = await first.submit(SleepRequest(candidate_code="interrupted", seconds=30), "a")
        queued = await first.submit(SleepRequest(candidate_code="waiting"), "a")
        await anyio.sleep(0.05)
    assert tools.store.get_job(running.id)["status"] == "queued"
    # a server that died without cleaning up (SIGKILL) leaves "running" under a dead owner
    tools.store.update_job(running.id, status="running", owner=f"{first.owner.rsplit(':', 1)[0]}:{2**22 + 1}")
    tools.store.update_job(queued.id, owner=f"{first.owner.rsplit(':', 1)[0]}:{2**22 + 1}")
    assert not jobs_module.pid_alive(2**22 + 1)

    second = JobManager(tools, parallel=2)
    async with second.running():
        with anyio.fail_after(5):
            while tools.store.get_job(queued.id)["status"] != "done":
                await anyio.sleep(0.02)
        # the resumed "interrupted" job runs again (30 s): cancel it to end the test
        assert second.view(running.id).status == "running"
        second.cancel(running.id)
    assert tools.started.count("interrupted") == 2 and tools.started.count("waiting") == 1


async def test_a_job_whose_server_died_running_it_twice_fails_with_the_reason(tmp_path, monkeypatch):
    """A job that kills its server must not kill every server that resumes it: retried once, then failed."""
    monkeypatch.setattr(jobs_module, "parse_request", lambda data: SleepRequest(**data))
    tools = FakeTools(tmp_path)
    dead = f"{os.uname().nodename}:{2**22 + 1}"
    assert not jobs_module.pid_alive(2**22 + 1)
    tools.store.insert_job({"job_id": "j1", "key": "k", "tool": "compile_kernel", "backend": "cpu", "client": "a",
                            "device": "test-cpu", "owner": dead, "status": "running",
                            "request": SleepRequest(candidate_code="killer", seconds=30).model_dump(),
                            "created_at": time.time()})
    for attempt in (1, 2):
        manager = JobManager(tools)
        async with manager.running():
            if attempt == 1:  # resumed once, and running again
                with anyio.fail_after(5):
                    while tools.store.get_job("j1")["status"] != "running":
                        await anyio.sleep(0.02)
                assert tools.store.get_job("j1")["crashes"] == 1
                manager._tg.cancel_scope.cancel()  # stands for the server's death: ...
            await anyio.sleep(0.05)
        if attempt == 1:
            tools.store.update_job("j1", status="running", owner=dead)  # ... which leaves it "running"
    job = tools.store.get_job("j1")
    assert job["status"] == "failed" and job["crashes"] == 2 and "died while running this job 2 times" in job["error"]
    assert tools.started.count("killer") == 1


async def test_a_live_servers_jobs_are_not_taken(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs_module, "parse_request", lambda data: SleepRequest(**data))
    tools = FakeTools(tmp_path)
    tools.store.insert_job({"job_id": "j1", "key": "k", "tool": "compile_kernel", "backend": "cpu", "client": "a",
                            "device": "test-cpu", "owner": f"{os.uname().nodename}:{os.getppid()}", "status": "queued",
                            "request": SleepRequest(candidate_code="theirs").model_dump(), "created_at": time.time()})
    async with JobManager(tools).running():
        await anyio.sleep(0.1)
    assert tools.started == [] and tools.store.get_job("j1")["status"] == "queued"


def test_killing_a_worker_reaches_compilers_in_process_groups_of_their_own():
    """Ninja starts each build command in a new process group: a killed build must not leave them running."""
    from kforge.tools.process.lifecycle import killpg, session_members

    worker = subprocess.Popen([sys.executable, "-c", "import subprocess, time\n"
                               "subprocess.Popen(['sleep', '300'], process_group=0)\ntime.sleep(300)"],
                              start_new_session=True)
    deadline = time.monotonic() + 30
    while len(session_members(worker.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    [child] = [m for m in session_members(worker.pid) if m != worker.pid]
    assert os.getpgid(child) != worker.pid  # in a group of its own, as ninja's compilers are
    killpg(worker.pid)
    assert worker.wait(timeout=10) == -9
    deadline = time.monotonic() + 10
    while session_members(worker.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session_members(worker.pid) == []
