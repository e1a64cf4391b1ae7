"""Nsight Compute in the sandbox on a real GPU (issue 17): ncu's front-end and the candidate it profiles share one
sandbox, and the counters still come (skipped without a GPU or ncu; run by scripts/run_gpu_tests.sh).

The candidates are the served examples with a probe appended: at import, in every worker that loads them (the
ncu worker's included), they try to read the server's store, see the server's process, reach its network, and
print what they saw to the worker's log, which the test reads from the job's kept scratch directory. Where ncu
collects nothing, the assertion carries ncu's own log (nsight.log), the ncu worker's log and its sandbox report."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.profilers.ncu import ncu_install
from kforge.server.catalog import problem_reference
from kforge.tools.context import ToolContext
from kforge.tools.profile import profile_kernel
from kforge.tools.requests import ProfileRequest
from kforge.tools.process.runner import WorkerProcess
from kforge.tools.process.lifecycle import worker_env
from kforge.tools.process.limits import confinement, WorkerLimits

from .conftest import EXAMPLES

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu) on PATH")]

_PIECES = ("user namespace", "PID namespace", "mount namespace", "IPC namespace", "network namespace",
           "private /tmp, /dev/shm and data directory", "own /proc", "no_new_privs", "no capabilities",
           "system-call filter")

_PROBE = '''

def _kforge_probe():
    import json, os, socket
    maps = open("/proc/self/maps").read()
    seen = {{"under_ncu": "nsight" in maps.lower() or "injection" in maps.lower(), "pid": os.getpid(),
            "server_visible": os.path.exists("/proc/{server_pid}/cmdline") and "pytest" in open("/proc/{server_pid}/cmdline").read()}}
    try:
        seen["store"] = "READ %d bytes" % len(open({store!r}, "rb").read())
    except OSError as exc:
        seen["store"] = "blocked: " + exc.__class__.__name__
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
        seen["server_port"] = "CONNECTED"
    except OSError as exc:
        seen["server_port"] = "blocked: " + exc.__class__.__name__
    print("KFORGE-PROBE " + json.dumps(seen), flush=True)


_kforge_probe()
'''


@pytest.fixture
def ncu_workers(monkeypatch) -> list[dict]:
    """The ncu workers' sandbox reports, as the server took them at their start."""
    seen: list[dict] = []
    start = WorkerProcess.__aenter__

    async def spy(self: WorkerProcess) -> WorkerProcess:
        started = await start(self)
        if self.role == "rerun":
            seen.append({"isolation": self.isolation, "network": self.network, "log": self.log})
        return started

    monkeypatch.setattr(WorkerProcess, "__aenter__", spy)
    return seen


def _tail(path: Path | None, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:] if path else "(none)"
    except OSError as exc:
        return f"(unreadable: {exc})"


@pytest.mark.anyio
@pytest.mark.parametrize("backend", ["cuda", "triton"])
async def test_ncu_collects_counters_in_the_sandbox_and_the_candidate_reaches_nothing(backend, tmp_path, ncu_workers):
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(), keep_scratch=True)
    listener = socket.create_server(("127.0.0.1", 0))  # a port of the server's, on the host's network
    candidate = (EXAMPLES / backend / "candidate.py").read_text() + _PROBE.format(
        server_pid=os.getpid(), store=str(ctx.home / "kforge.db"), port=listener.getsockname()[1])
    try:
        result = await profile_kernel(ctx, ProfileRequest(backend=backend, reference_code=problem_reference("relu"),
                                                          candidate_code=candidate, baselines=("eager",),
                                                          budget_s=0.5, hardware_counters=True))
    finally:
        listener.close()
    assert result.ok, result.failure
    assert len(ncu_workers) == 1, ncu_workers
    [ncu] = ncu_workers
    nsight = ctx.home / "artifacts" / str(result.profile_id) / "nsight.log"
    context = (f"\nncu worker's sandbox: {json.dumps(ncu['isolation'])} (network {ncu['network']})"
               f"\ncounters_note: {result.report.counters_note}\nwarnings: {result.warnings}"
               f"\n--- nsight.log ---\n{_tail(nsight)}\n--- ncu worker's log ---\n{_tail(ncu['log'])}")

    # The sandbox holds around ncu and its target: every piece a worker gets.
    for piece in _PIECES:
        assert piece in ncu["isolation"]["applied"], context
    assert any(p.startswith("landlock") for p in ncu["isolation"]["applied"]), context
    assert ncu["network"] == "isolated", context
    # ncu's injection starts a thread in the worker before the worker applies Landlock (H100, 2026-11-25): the
    # launcher's own domain, applied before it execs ncu, holds that thread, and nothing is said missing.
    assert "landlock on the profiler and every thread of its target (ncu's injection too)" in \
        ncu["isolation"]["applied"], context
    assert any("earlier thread(s) (ncu's injection) under the profiler's Landlock" in p
               for p in ncu["isolation"]["applied"]), context  # (that thread was there, and is covered)
    assert not ncu["isolation"]["missing"], context
    assert not [w for w in result.warnings if "Nsight Compute run's sandbox" in w], context

    # ... and ncu still works inside it: the candidate's own kernel was profiled, with hardware counters.
    own = [k for k in result.report.ncu if k.is_custom and k.name.startswith("relu_kernel")]
    assert own, "ncu collected none of the candidate's kernels in the sandbox" + context
    assert own[0].metrics.get("Memory Throughput", 0) > 0 and own[0].metrics.get("Duration [us]", 0) > 0, context

    # The candidate, run under ncu, reached nothing of the server's.
    probes = [json.loads(line.removeprefix("KFORGE-PROBE ")) for line in _tail(ncu["log"], 10**6).splitlines()
              if line.startswith("KFORGE-PROBE ")]
    assert probes, "the probe did not run in the ncu worker" + context
    seen = probes[-1]
    assert seen["under_ncu"], seen  # it ran in the profiled process (ncu's injection mapped in it)
    assert seen["store"].startswith("blocked"), seen
    assert seen["server_port"].startswith("blocked"), seen
    assert not seen["server_visible"], seen


def test_ncu_profiles_a_torch_program_in_the_bare_sandbox(tmp_path):
    """ncu on a plain torch program in the sandbox alone (no worker, no KForge protocol): where the test above
    fails and this passes, the worker's side is at fault; where both fail, ncu and the sandbox are, and the log
    says which piece (a refused system call, file or device)."""
    home, scratch = tmp_path / "home", tmp_path / "home" / "jobs" / "bare" / "ncu"
    scratch.mkdir(parents=True)
    ncu_path = shutil.which("ncu")
    conf = confinement(home, WorkerLimits(read_paths=(ncu_install(ncu_path),)), scratch)  # as `_rerun_pass` has it
    log, report = scratch / "nsight.log", scratch / "profile"
    # The program applies Landlock itself before torch, as the profiled worker does (`--landlock`): the sandbox's
    # process leaves it to its target (`Confinement.landlock_later`).
    program = ("import json, sys; from kforge.tools.process.sandbox import Confinement, apply_landlock; "
               "print('landlock', json.dumps(apply_landlock(Confinement.from_arg(sys.argv[1]))), flush=True); "
               "import torch; x = torch.randn(1 << 20, device='cuda'); torch.relu(x); torch.cuda.synchronize(); "
               "print('program done', flush=True)")
    ncu = [ncu_path, "--log-file", str(log), "--export", str(report), "--force-overwrite",
           "--launch-count", "1", "--clock-control", "none", "--section", "SpeedOfLight"]
    ours, theirs = socket.socketpair()  # fd 0: the wrapper's report goes there first, as to the server
    with ours:
        done = subprocess.run([sys.executable, "-m", "kforge.tools.process.profiled_launch", conf.as_arg(), "--", *ncu,
                               sys.executable, "-c", program, conf.as_arg()],
                              stdin=theirs.fileno(), capture_output=True, text=True, timeout=300, cwd=scratch,
                              env=worker_env(home, scratch, {"HOME": str(scratch)}))
        theirs.close()
        ours.settimeout(5)
        first = ours.recv(1 << 16).decode(errors="replace").splitlines()
    sandbox = json.loads(first[0])["sandbox"] if first else {}
    context = (f"\nrc {done.returncode}\nsandbox: {json.dumps(sandbox)}\nstdout: {done.stdout[-3000:]}"
               f"\nstderr: {done.stderr[-3000:]}\n--- nsight.log ---\n{_tail(log)}")
    assert "PID namespace" in sandbox.get("applied", []), context
    assert '"applied": ["landlock' in done.stdout, context  # applied by the program itself, under ncu
    assert "program done" in done.stdout, context
    assert report.with_suffix(".ncu-rep").is_file(), context
