"""The job manager with an executor other than this host (the fleet's seam), and `kforge serve --ray` without
Ray: no Ray needed. The fleet itself, on a local Ray cluster: tests/test_fleet.py."""

from __future__ import annotations

import subprocess
import sys
import time

import anyio
import pytest

from pydantic import BaseModel

from kforge.backends import Availability
from kforge.server.settings import Settings, ray_fleet, tool_context
from kforge.tools.tool_inputs import RequestError
from kforge.tools.dispatch import run_request
from kforge.tools.jobs import JobLost, JobManager, JobStatus
from kforge.tools.models import CompileResult, JobSpec
from kforge.tools.process.limits import WorkerLimits
from kforge.tools.store import ResultStore

from .conftest import kforge_command, server_env
from .test_jobs import FakeTools, SleepRequest, _no_progress

pytestmark = pytest.mark.anyio


class DyingNodes:
    """An executor whose machines die under the first `deaths` jobs it runs, then run them as this host would."""

    def __init__(self, tools: FakeTools, deaths: int) -> None:
        self.tools, self.deaths, self.names = tools, deaths, []

    async def require_backend(self, name: str) -> Availability:
        if name != "cpu":
            raise RequestError(f"no node offers {name!r}")
        return Availability(backend="cpu", ok=True, reason="test", device_name="a node's CPU")

    def queue_for(self, avail: Availability) -> str:
        return "fleet CPUs"

    async def run(self, request, progress, *, name: str):
        self.names.append(name)
        if self.deaths:
            self.deaths -= 1
            await progress(0, None, "running on node-1")
            raise JobLost(f"node-{len(self.names)} died mid-job")
        return await run_request(self.tools, request, progress), f"node-{len(self.names)}"


async def _finish(manager: JobManager, job) -> object:
    with anyio.fail_after(10):
        return await manager.wait(job, 10, _no_progress)


async def test_a_job_whose_node_died_is_requeued_once_and_says_so(tmp_path):
    tools = FakeTools(tmp_path)
    nodes = DyingNodes(tools, deaths=1)
    manager = JobManager(tools, executor=nodes)
    async with manager.running():
        job = await manager.submit(SleepRequest(candidate_code="a"), "c1")
        assert job.device == "fleet CPUs"
        result = await _finish(manager, job)
    assert result.ok and nodes.names == [f"kforge compile_kernel {job.id}"] * 2
    row = tools.store.get_job(job.id)
    assert row["status"] == "done" and row["crashes"] == 1
    assert row["message"] == "done on node-2; re-queued once after node-1 died mid-job"


async def test_a_job_whose_nodes_died_twice_fails_with_the_reason(tmp_path):
    tools = FakeTools(tmp_path)
    manager = JobManager(tools, executor=DyingNodes(tools, deaths=2))
    async with manager.running():
        job = await manager.submit(SleepRequest(candidate_code="a"), "c1")
        status = await _finish(manager, job)
    assert isinstance(status, JobStatus) and status.status == "failed"
    assert status.error.startswith("node-2 died mid-job; the machines running this job died 2 times (it was re-queued 1")
    assert "Call compile_kernel again" in status.error and tools.started == []


async def test_the_executor_decides_which_backends_exist(tmp_path):
    tools = FakeTools(tmp_path)
    manager = JobManager(tools, executor=DyingNodes(tools, deaths=0))
    async with manager.running():
        with pytest.raises(RequestError, match="no node offers 'cuda'"):
            await manager.submit(SleepRequest(candidate_code="a", backend="cuda"), "c1")


def test_without_ray_configured_jobs_run_on_this_host(tmp_path):
    settings = Settings(home=tmp_path)
    assert settings.ray is None and ray_fleet(settings, tool_context(settings)) is None
    check = "import sys, kforge.server.app, kforge.server.cli; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], check=True, timeout=120)  # Ray is imported only when configured


def test_serve_with_ray_but_without_ray_installed_says_how_to_install_it(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "ray.py").write_text("raise ImportError(\"No module named 'ray'\")\n")  # stands in for an absent Ray
    env = server_env(tmp_path / "home", KFORGE_RAY="auto")
    env["PYTHONPATH"] = f"{shim}:{env.get('PYTHONPATH', '')}".rstrip(":")
    proc = subprocess.run([*kforge_command(), "serve"], env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert "needs Ray installed on this host and on every node: pip install 'kforge[ray]'" in proc.stderr


class RecordingJob(BaseModel):
    """A job type of its own (`dispatch.run_request` runs it): reports progress, records history in the node's store
    from a task of its own, then finishes; or sleeps until cancelled, noting that."""

    tool: str = "compile_kernel"
    backend: str = "cpu"
    candidate_code: str
    seconds: float = 0.05

    async def run(self, ctx, progress) -> CompileResult:
        await progress(0, 1, f"working on {self.candidate_code}")
        async with anyio.create_task_group() as tg:  # a write from a task the job started counts as the job's
            tg.start_soon(lambda: _record(ctx, self.candidate_code))
        try:
            await anyio.sleep(self.seconds)
        except anyio.get_cancelled_exc_class():
            CANCELLED.append(self.candidate_code)
            raise
        spec = JobSpec(tool="compile_kernel", backend="cpu", candidate_sha256=self.candidate_code, options={},
                       environment={})
        return CompileResult(spec=spec, ok=True, build_seconds=0.0, load_seconds=self.seconds, from_cache=False)


CANCELLED: list[str] = []


async def _record(ctx, code: str) -> None:
    ctx.store.record_history(reference_sha256="ref", backend="cpu", candidate_sha256=code, tool="compile_kernel")


def _agent(tmp_path, monkeypatch, slots: int):
    from kforge.tools import fleet_node

    monkeypatch.setattr(fleet_node, "parse_request", RecordingJob.model_validate)
    return fleet_node.NodeAgent(fleet_node.NodeConfig(limits=WorkerLimits(), home=str(tmp_path), slots=slots))


async def _events(agent, code: str, seconds: float = 0.05) -> list:
    return [e async for e in agent.run_job({"candidate_code": code, "seconds": seconds})]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # a Ray actor's loop is asyncio's
async def test_a_node_agent_runs_jobs_side_by_side_and_sends_each_its_own_store_writes(tmp_path, monkeypatch):
    agent = _agent(tmp_path, monkeypatch, slots=2)
    results: dict[str, list] = {}

    async def one(code: str) -> None:
        results[code] = await _events(agent, code, 0.3)

    with anyio.fail_after(10):
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for code in ("a", "b"):
                tg.start_soon(one, code)
        assert time.monotonic() - started < 0.55  # two slots: the two jobs ran side by side
    for code, events in results.items():
        assert [e.kind for e in events] == ["started", "progress", "result"]
        assert events[1].message == f"working on {code}"
        assert events[2].result["spec"]["candidate_sha256"] == code
        assert [h["candidate_sha256"] for h in events[2].writes.history] == [code]  # its own write only


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_node_agent_queues_jobs_beyond_its_slots(tmp_path, monkeypatch):
    agent = _agent(tmp_path, monkeypatch, slots=1)
    with anyio.fail_after(10):
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for code in ("a", "b"):
                tg.start_soon(_events, agent, code, 0.3)
        assert time.monotonic() - started >= 0.6  # one slot: one after the other


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_cancelling_a_node_agents_call_cancels_its_job(tmp_path, monkeypatch):
    """`ray.cancel` of an async actor's call cancels the task that runs it: the job's own task is cancelled too, and
    awaited, before the call ends (so its workers are killed first)."""
    agent = _agent(tmp_path, monkeypatch, slots=1)
    seen: list[str] = []

    async def call() -> None:
        async for event in agent.run_job({"candidate_code": "slow", "seconds": 30}):
            seen.append(event.kind)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            while "progress" not in seen:
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert CANCELLED[-1:] == ["slow"] and seen == ["started", "progress"]
    assert [e.kind for e in await _events(agent, "next")] == ["started", "progress", "result"]  # its slot is free


class _Call:
    def __init__(self, fn):
        self.remote = fn


class _Actor:
    """A node agent's handle whose `probe` never answers (Ray cannot start it), or fails (its node died)."""

    def __init__(self, fails: bool = False) -> None:
        async def never():
            await anyio.sleep_forever()

        async def died():
            raise _FakeRay.exceptions.RayError("node died")

        self.probe = _Call(died if fails else never)


class _FakeRay:
    class exceptions:
        class RayError(Exception):
            pass

    killed: list = []

    @classmethod
    def kill(cls, actor) -> None:
        cls.killed.append(actor)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_node_whose_agent_does_not_start_is_dropped_and_not_tried_again_at_once(tmp_path, monkeypatch):
    """A node whose CPUs or GPUs other work holds never starts its agent: Ray's actor stays pending and its probe never
    answers. The fleet must not wait on it forever: it gives up after `_AGENT_START_S`, kills the pending actor, and
    leaves the node alone for `_REFUSED_S` (a job would otherwise wait that long at every look for new nodes)."""
    from kforge.tools import fleet
    from kforge.tools.fleet_node import NodeConfig

    monkeypatch.setattr(fleet, "_AGENT_START_S", 0.2)
    ray_fleet = fleet.RayFleet("auto", NodeConfig(limits=WorkerLimits()), ResultStore(tmp_path))
    for node_id, actor in (("pending", _Actor()), ("dead", _Actor(fails=True))):
        agent = fleet._Agent(node_id=node_id, actor=actor, slots=1)
        ray_fleet._agents[node_id] = agent
        with anyio.fail_after(5):
            await ray_fleet._probe_agent(_FakeRay, agent)
        assert agent.probed is None and node_id not in ray_fleet._agents and actor in _FakeRay.killed
        assert node_id in ray_fleet._refused


def test_a_node_traces_into_its_own_data_directory_never_the_servers_path(tmp_path):
    """The server's trace file is a path of its host; a node asked to trace writes `trace.jsonl` in its own data
    directory (`bench/gpu_throughput.py` reads both), and one not asked writes none."""
    from kforge.tools import fleet_node

    servers = WorkerLimits(trace_file=str(tmp_path / "server-trace.jsonl"))
    traced = fleet_node.NodeAgent(fleet_node.NodeConfig(limits=servers, home=str(tmp_path / "a"), trace=True))
    assert traced.tools.limits.trace_file == str(tmp_path / "a" / "trace.jsonl")
    quiet = fleet_node.NodeAgent(fleet_node.NodeConfig(limits=servers, home=str(tmp_path / "b")))
    assert quiet.tools.limits.trace_file is None


class _AnyResult(BaseModel):
    model_config = {"extra": "allow"}


class _JobActor:
    """A node agent's handle whose `run_job` streams a started event and a result, and records what it ran."""

    def __init__(self, node: str, ran: list) -> None:
        from types import SimpleNamespace

        from kforge import __version__
        from kforge.tools.fleet_node import StoreWrites

        class RunJob:
            def options(self, **_):
                return self

            def remote(self, request):
                ran.append(request["candidate_code"])

                async def events():
                    for event in (SimpleNamespace(kind="started", node=node, address="10.0.0.1", version=__version__),
                                  SimpleNamespace(kind="result", result={"ok": True}, writes=StoreWrites())):
                        yield _done(event)
                return events()

        self.run_job = RunJob()


async def _done(value):
    return value


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_candidates_next_job_goes_to_the_node_that_ran_its_last_one(tmp_path, monkeypatch):
    """As on one host, where a job goes to the GPU that keeps its candidate's process: the node that ran a candidate's
    last job (its compile's or verify's process is kept there) counts one job fewer, and wins a tie; a node two jobs
    busier does not get it (16 of 48 candidates changed node between their jobs on 2x H200, s22)."""
    from kforge.tools import fleet
    from kforge.tools.fleet_node import NodeConfig
    from kforge.tools.requests import CompileRequest

    monkeypatch.setattr(fleet, "result_model", lambda tool: _AnyResult)
    ray_fleet = fleet.RayFleet("auto", NodeConfig(limits=WorkerLimits()), ResultStore(tmp_path))
    ray_fleet._ray, ray_fleet._probed_at = _FakeRay, time.monotonic()
    ran: dict[str, list] = {"a": [], "b": []}
    for node in ran:
        ray_fleet._agents[node] = fleet._Agent(node_id=node, actor=_JobActor(node, ran[node]), slots=2, offers={"cpu"})

    async def run(code: str) -> str:
        _, where = await ray_fleet.run(CompileRequest(backend="cpu", candidate_code=code), _no_progress, name=code)
        return where

    with anyio.fail_after(10):
        assert "Ray node a" in await run("one")  # both idle
        ray_fleet._agents["a"].in_flight = 1  # a is busier: a new candidate goes to b
        assert "Ray node b" in await run("two")
        assert "Ray node a" in await run("one")  # one job busier, but it keeps candidate one's process
        assert "Ray node b" in await run("two")
        ray_fleet._agents["a"].in_flight = 3  # two jobs per slot busier than b: not worth the kept process
        assert "Ray node b" in await run("one")
        assert "Ray node b" in await run("one")  # and b now keeps it
    assert ran == {"a": ["one", "one"], "b": ["two", "two", "one", "one"]}
