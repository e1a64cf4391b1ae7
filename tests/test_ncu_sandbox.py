"""A worker under a profiler (ncu) runs in the sandbox, sharing it with the profiler's front-end (issue 17).

No GPU here: a stand-in for ncu that runs its command as a child and writes its "report" once the worker is gone,
as ncu does. The candidate code runs at import in the worker under it, as it would under ncu. The GPU run of the
real ncu is tests/test_gpu_ncu_sandbox.py."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from kforge.tools.context import ToolContext
from kforge.tools.evaluate import compile_kernel
from kforge.tools.requests import CompileRequest
from kforge.tools.harness.integrity import process_stat
from kforge.tools.process.protocol import LoadRequest
from kforge.tools.process.runner import WorkerProcess
from kforge.tools.process.lifecycle import sandboxed_worker
from kforge.tools.process.limits import WorkerLimits

from .test_build_cache_promotion import _code
from .test_issue17_leftovers_cache import _DAY, _age, _cold_entry, _prune_one

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux's")]

# The pieces a worker under ncu must have, as every other worker (`kforge.tools.process.sandbox`).
_PIECES = ("user namespace", "PID namespace", "mount namespace", "IPC namespace", "network namespace",
           "private /tmp, /dev/shm and data directory", "own /proc", "no_new_privs", "no capabilities",
           "system-call filter")

# What the candidate tries from inside, printed to the worker's log (its stdout) for the test to read.
_PROBE = '''
import json, os, socket
seen = {{"pid": os.getpid(), "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}}
try:
    seen["store"] = open({store!r}).read()
except OSError as exc:
    seen["store"] = "blocked: " + exc.__class__.__name__
try:
    seen["parent"] = open(f"/proc/{{os.getppid()}}/cmdline").read().replace("\\0", " ")
except OSError as exc:
    seen["parent"] = "unreadable: " + exc.__class__.__name__
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    seen["server_port"] = "CONNECTED"
except OSError as exc:
    seen["server_port"] = "blocked: " + exc.__class__.__name__
try:
    open({outside!r}, "w").write("note")
    seen["write_outside"] = "SUCCEEDED"
except OSError as exc:
    seen["write_outside"] = "blocked: " + exc.__class__.__name__
print("KFORGE-PROBE " + json.dumps(seen), flush=True)
'''


@pytest.fixture
def fake_ncu(tmp_path) -> list[str]:
    """A stand-in for ncu's front-end: it runs the worker as its child (it stays the namespace's PID 1, as ncu
    does), then, a moment after the worker is gone, writes its report where it was told."""
    script = tmp_path / "bin" / "fake-ncu"
    script.parent.mkdir()
    script.write_text('#!/bin/sh\nreport="$1"; shift\n"$@"\nsleep 0.5\necho "worker exited $?" > "$report"\n')
    script.chmod(0o755)
    return [str(script)]


def _limits(fake_ncu: list[str]) -> WorkerLimits:
    """The stand-in's directory readable in the sandbox, as `_rerun_pass` makes ncu's install (`ncu_install`)."""
    return WorkerLimits(read_paths=(str(Path(fake_ncu[0]).parent),))


def _require(isolation: dict) -> None:
    missing = [m for m in isolation["missing"] if any(p in m for p in ("namespace", "landlock", "mounts", "/proc"))]
    if missing:
        pytest.skip(f"this host refuses part of the sandbox: {missing}")


def _probe_seen(log: Path) -> dict:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("KFORGE-PROBE ")]
    assert lines, log.read_text(errors="replace")[-3000:]
    return json.loads(lines[-1].removeprefix("KFORGE-PROBE "))


def _gone(pid: int, wait_s: float = 10.0) -> bool:
    """The process is gone (or a zombie, which runs nothing) within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if (st := process_stat(pid)) is None or st[1] == "Z":
            return True
        time.sleep(0.05)
    return False


async def test_a_worker_under_a_profiler_is_sandboxed_with_it(tmp_path, fake_ncu):
    home = tmp_path / "home"
    (home / "jobs" / "j1").mkdir(parents=True)
    (home / "kforge.db").write_text("the store")
    scratch = home / "jobs" / "j1" / "ncu"
    report = scratch / "profile.ncu-rep"
    listener = socket.create_server(("127.0.0.1", 0))  # the server's own port, on the host's network
    probe = _PROBE.format(store=str(home / "kforge.db"), port=listener.getsockname()[1],
                          outside=str(home / "jobs" / "j1" / "note"))
    try:
        async with WorkerProcess(backend="cpu", home=home, scratch=scratch, limits=_limits(fake_ncu), role="rerun",
                                 prefix=[*fake_ncu, str(report)]) as w:
            _require(w.isolation)
            for piece in _PIECES:
                assert piece in w.isolation["applied"], w.isolation
            assert any(p.startswith("landlock") for p in w.isolation["applied"]), w.isolation
            assert w.network == "isolated"
            assert not any("not asked for" in m for m in w.isolation["missing"]), w.isolation
            # The worker is a descendant of the front-end, found by the server at its start.
            front_end = sandboxed_worker(w._proc.pid)
            assert w._worker_pid is not None and front_end is not None and w._worker_pid != front_end
            loaded = await w.call(LoadRequest(role="candidate", source=_code(7, probe)), stage="ncu")
            assert loaded.failure is None, loaded
            seen = _probe_seen(w.log)
            worker_pid = w._worker_pid
    finally:
        listener.close()
    assert seen["store"].startswith("blocked"), seen  # the data directory is covered
    # Only its own directory is writable: a note beside it never reaches the host's directory (under a data directory
    # in /tmp, as here, it lands in the sandbox's private /tmp).
    assert not (home / "jobs" / "j1" / "note").exists(), seen
    assert seen["server_port"].startswith("blocked"), seen  # the host's network is not there
    assert os.getpid() not in seen["procs"] and len(seen["procs"]) <= 4, seen  # its namespace: front-end, worker
    assert "fake-ncu" in seen["parent"], seen  # ... under the profiler, inside the same namespace
    # The front-end wrote its report after the worker exited, and the server waited for it before the kill.
    assert report.read_text().startswith("worker exited"), report
    assert _gone(worker_pid) and _gone(front_end)


async def test_the_profiler_and_its_targets_threads_are_inside_landlock(tmp_path):
    """ncu's injection starts a thread in the worker before Python's main, where the worker's own Landlock cannot
    reach it; the launcher's domain, applied before it execs the profiler, holds the profiler and everything it
    starts. The stand-in front-end writes where only Landlock forbids it (/var/tmp: outside the covered paths,
    writable by the mounts), then runs the worker."""
    if not os.access("/var/tmp", os.W_OK):
        pytest.skip("no writable /var/tmp on this host")
    outside = Path("/var/tmp") / f"kforge-landlock-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / "bin" / "fake-ncu"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\nreport="$1"; shift\necho note > {outside} 2>/dev/null\n'
                      'echo "front-end env $KFORGE_PROFILER_LANDLOCK" > "$report"\n"$@"\n')
    script.chmod(0o755)
    home = tmp_path / "home"
    scratch = home / "jobs" / "j1" / "ncu"
    report = scratch / "profile.ncu-rep"
    try:
        async with WorkerProcess(backend="cpu", home=home, scratch=scratch, limits=_limits([str(script)]),
                                 role="rerun", prefix=[str(script), str(report)]) as w:
            _require(w.isolation)
            assert "landlock on the profiler and every thread of its target (ncu's injection too)" in \
                w.isolation["applied"], w.isolation
            assert not any("outside it" in m for m in w.isolation["missing"]), w.isolation
        assert not outside.exists(), "the profiler wrote outside its sandbox's writable paths"
        assert report.read_text().strip() == "front-end env 1", report.read_text()
    finally:
        outside.unlink(missing_ok=True)


async def test_a_kill_takes_the_profiler_and_the_worker_down(tmp_path, fake_ncu):
    """A timeout kills the worker's session: the profiler's front-end is PID 1 of its namespace, which dies with it."""
    home = tmp_path / "home"
    scratch = home / "jobs" / "j1" / "ncu"
    async with WorkerProcess(backend="cpu", home=home, scratch=scratch, limits=_limits(fake_ncu), role="rerun",
                             prefix=[*fake_ncu, str(scratch / "profile.ncu-rep")]) as w:
        _require(w.isolation)
        front_end, worker = sandboxed_worker(w._proc.pid), w._worker_pid
        assert front_end and worker
        await w.kill()
        assert _gone(front_end) and _gone(worker)
    assert not (scratch / "profile.ncu-rep").exists()  # killed, not let finish


async def test_a_cache_hit_under_a_profiler_is_marked_used(tmp_path, fake_ncu):
    """The server marks the build-cache entries the worker mapped (`disk.mark_loaded`): under ncu, the worker's own
    process, not the front-end's, which maps none."""
    ctx = ToolContext(home=tmp_path / "home", limits=_limits(fake_ncu))
    first = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=_code(5), use_store=False))
    assert first.ok, str(first)
    builds = ctx.home / "cache" / "builds"
    [entry] = builds.iterdir()
    _age(entry, 3 * _DAY)  # built long ago: without the hit marked, the first to go
    _cold_entry(builds, _DAY)
    scratch = ctx.home / "jobs" / "j1" / "ncu"
    async with WorkerProcess(backend="cpu", home=ctx.home, scratch=scratch, limits=ctx.limits, role="rerun",
                             prefix=[*fake_ncu, str(scratch / "profile.ncu-rep")]) as w:
        loaded = await w.call(LoadRequest(role="candidate", source=_code(5)), stage="ncu")
        assert loaded.failure is None and loaded.builds[0].from_cache, loaded
    assert _prune_one(ctx.home) == ["cache/builds/cold-0"]
    assert entry.is_dir()
