"""The job manager with an executor other than this host (the fleet's seam), and `kforge serve --ray` without
Ray: no Ray needed. The fleet itself, on a local Ray cluster: tests/test_fleet.py."""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from kforge.backends import Availability
from kforge.server.settings import Settings, ray_fleet, tool_context
from kforge.tools.tool_inputs import RequestError
from kforge.tools.dispatch import run_request
from kforge.tools.jobs import JobLost, JobManager, JobStatus

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


def test_a_node_job_can_be_interrupted_where_its_ray_worker_inherited_an_ignored_sigint():
    """`ray.cancel` interrupts a task through Python's SIGINT handler (`_thread.interrupt_main`), which does nothing
    where SIGINT is ignored, as in every worker of a node started from a background shell. The node's job puts the
    handler back first, so the interrupt lands. In a process of its own: it changes the process's signals."""
    script = """
import _thread, signal, time
from kforge.tools.fleet_node import _let_ray_interrupt
signal.signal(signal.SIGINT, signal.SIG_IGN)
_thread.interrupt_main()
time.sleep(0.05)  # ignored: nothing is raised
_let_ray_interrupt()
try:
    _thread.interrupt_main()
    time.sleep(5)
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "interrupted", done.stdout + done.stderr
