"""A worker process's life as the server sees it from outside: the environment it starts with, the trace lines of
its ops, what it is doing (its session, its PID namespace, its preemptions, threads still busy after it answered),
and its end (kill its whole session, await exits side by side). Used by the runner, the pool and the builds; it
imports none of them, so the three do not import each other.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, NamedTuple

import anyio

from kforge.backends.build.fast_build import job_cache_env
from kforge.backends.host import process_ids, process_stat

from .bytecode import pycache_prefix

__all__ = ["Preemption", "SCRATCH_OWNER", "busy_threads", "close_together", "kill_group", "killpg", "namespace_pids",
           "namespace_processes", "pid_alive", "preemptions", "sandboxed_worker", "scratch_name", "session_members", "trace", "traced",
           "worker_env"]

# Variables a worker may inherit, with those the backends name (`Backend.worker_env_names`: a device's toolkit and
# pin); everything else (tokens, API keys, ...) is dropped.
_ENV_ALLOWLIST = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TERM", "PYTHONPATH", "LD_LIBRARY_PATH",
    "CXX", "CC", "MAX_JOBS", "SSL_CERT_FILE",
    # OpenMP's thread count, waiting and binding, as the operator set them for the server: the CPU backend
    # gives candidate, eager and torch.compile the same team (OMP_NUM_THREADS, else every usable CPU), and
    # the same knobs make a worker's OpenMP behave as `torch.utils.benchmark` run from the operator's shell.
    "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_PROC_BIND", "OMP_PLACES", "KMP_BLOCKTIME",
    "KMP_AFFINITY",
)


def worker_env(home: Path, scratch: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    from kforge.backends import worker_env_names

    allowed = (*_ENV_ALLOWLIST, *worker_env_names())
    env = {k: v for k, v in os.environ.items() if k in allowed}
    here = Path(__file__).resolve().parents[2]  # the kforge package directory
    if here.name == "kforge":  # a plain checkout on sys.path: make it importable for the child too
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(here.parent), env.get("PYTHONPATH")) if p)
    env.update({
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        # Inductor compiles in-process: a worker pool would look like (and be) background processes.
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        **job_cache_env(scratch),
    })
    if (prefix := pycache_prefix(home)) is not None:  # torch has no byte-code of its own here (`bytecode`)
        env["PYTHONPYCACHEPREFIX"] = str(prefix)
    env.update(extra or {})
    return env


def session_members(sid: int) -> list[int]:
    """The processes of session `sid`, from /proc (Linux; elsewhere none are found)."""
    return [int(pid) for pid in process_ids() if (st := process_stat(pid)) is not None and st[3] == sid]


def sandboxed_worker(outer_pid: int) -> int | None:
    """The worker inside its own PID namespace: the only child of the outer process the server knows
    (`kforge.tools.process.sandbox`); None when there is none (no namespace, or it is gone)."""
    try:
        return int(Path(f"/proc/{outer_pid}/task/{outer_pid}/children").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# A scratch directory's name ends with the server that made it: "+<pid>@<host>" (`scratch_name`).
SCRATCH_OWNER = re.compile(r"\+(\d+)@([^/]+)$")


def scratch_name(prefix: str) -> str:
    """A new scratch directory's name under `jobs/`, ending with this server's pid and host: a later server
    on the same data directory removes it if this one died before its own cleanup
    (`kforge.tools.context.sweep_leftovers`)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}+{os.getpid()}@{socket.gethostname()}"


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid exists on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Preemption(NamedTuple):
    """How much the scheduler kept the worker's threads from running so far (`preemptions`)."""

    switches: int  # involuntary context switches: a core taken from one of its threads
    waited_s: float  # time its threads were ready to run and waited on a run queue


def preemptions(outer_pid: int) -> Preemption | None:
    """How often, and how long, the scheduler kept the worker's threads off a core so far, as the server reads
    it in /proc; None when it cannot be read. The worker is the outer process's child where it has a PID
    namespace of its own, else the outer process itself. The wait matters beside the count: on a busy 2-core VM
    one preemption of a 1 ms op lasted several ms (an honest candidate's op read 4.7x its timed calls)."""
    pid = sandboxed_worker(outer_pid) or outer_pid
    try:
        switches, waited_ns = 0, 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    switches += int(line.split()[1])
            try:
                waited_ns += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError):
                pass  # a kernel without schedstats: the count alone decides
        return Preemption(switches, waited_ns / 1e9)
    except (OSError, ValueError):
        return None


def namespace_pids(outer_pid: int) -> list[int]:
    """Every process in the PID namespace of the worker whose outer process is `outer_pid`, the worker (its PID 1)
    first, as this process numbers them; none without a namespace (`kforge.tools.process.sandbox`)."""
    if (worker := sandboxed_worker(outer_pid)) is None:
        return []
    try:
        namespace = os.readlink(f"/proc/{worker}/ns/pid")
    except OSError:
        return []
    found = [worker]
    for pid in process_ids():
        try:
            if int(pid) not in (worker, outer_pid) and os.readlink(f"/proc/{pid}/ns/pid") == namespace:
                found.append(int(pid))
        except OSError:
            continue
    return found


def namespace_processes(outer_pid: int) -> list[str]:
    """The live processes in the PID namespace of the worker whose outer process is `outer_pid`, except the
    worker itself (its PID 1), named as this process sees them: the server's own count, out of the
    candidate's reach (`kforge.tools.process.sandbox`)."""
    found = []
    for pid in namespace_pids(outer_pid)[1:]:
        if (st := process_stat(pid)) is not None and st[1] != "Z":  # a zombie runs nothing
            found.append(f"process {pid} ({st[0]}), seen by the server in the worker's PID namespace")
    return found


# A worker that has answered waits for its next op: its threads sleep (an OpenMP pool spins for a few ms after
# its last parallel region, then sleeps too). The server watches them this long, after this settling time, and
# calls a thread that ran more than this share of the window background work (`busy_threads`).
_IDLE_SETTLE_S, _IDLE_WINDOW_S, _IDLE_BUSY_SHARE = 0.01, 0.03, 0.2


def _threads_cpu_ns(pid: int) -> dict[int, tuple[str, int]]:
    """Each thread of `pid`: its name and the CPU time it has run (ns, the scheduler's own count)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            ran = int((task / "schedstat").read_text().split()[0])
            found[int(task.name)] = ((task / "comm").read_text().strip(), ran)
        except (OSError, ValueError, IndexError):
            continue
    return found


async def busy_threads(outer_pid: int) -> list[str]:
    """The worker's threads that kept running after it answered, as the server reads them in /proc: the same
    check inside the candidate's process sees only Python's threads, and could be patched there."""
    pid = sandboxed_worker(outer_pid) or outer_pid
    await anyio.sleep(_IDLE_SETTLE_S)
    before = _threads_cpu_ns(pid)
    await anyio.sleep(_IDLE_WINDOW_S)
    after = _threads_cpu_ns(pid)
    busy = []
    for tid, (name, ran) in sorted(after.items()):
        spent = ran - before.get(tid, (name, 0))[1]
        if spent > _IDLE_BUSY_SHARE * _IDLE_WINDOW_S * 1e9:
            busy.append(f"thread {tid} ({name}) ran {spent / 1e6:.0f} ms of the {_IDLE_WINDOW_S * 1e3:.0f} ms after "
                        "the worker answered, seen by the server")
    return busy


def killpg(pid: int) -> None:
    """SIGKILL a worker's whole session: its group, and the compilers ninja ran in groups of their own.

    A worker leads its own session (and group). Ninja starts each build command in a new process
    group, so killing the group alone left compilers of a timed-out build running.
    """
    _quietly(os.killpg, pid, signal.SIGKILL)
    for member in session_members(pid):
        _quietly(os.kill, member, signal.SIGKILL)


def _quietly(kill: Any, pid: int, sig: int) -> None:
    try:
        kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # gone already


async def kill_group(proc: Any) -> None:
    """Kill a worker's group and wait (briefly) for the worker to be gone."""
    killpg(proc.pid)
    with anyio.move_on_after(5):
        await proc.wait()


def trace(role: str, op: str, warm: bool, started: float, peak_bytes: list[int] | None = None,
          seconds: float | None = None, *, to: str | None, **facts: Any) -> None:
    """One line of the trace file `to` (`WorkerLimits.trace_file`; None: none): who did what, warm or cold, since
    `started` (perf_counter) for `seconds` (default: until now), the worker's peaks of reserved and of allocated
    device memory during the op where it has them, and `facts` that are set (where it ran, how long it was stopped)."""
    if to:
        took = time.perf_counter() - started if seconds is None else seconds
        line = {"role": role, "op": op, "warm": warm, "at": round(started, 3), "s": round(took, 3)}
        if peak_bytes:
            line["peak_gb"], line["peak_allocated_gb"] = (round(b / 1e9, 3) for b in peak_bytes)
        line.update((k, v) for k, v in facts.items() if v)
        with open(to, "a") as f:
            f.write(json.dumps(line) + "\n")


async def close_together(closes: list[Callable[[], Awaitable[None]]]) -> None:
    """Run every close at once and return when all are done (workers' exits overlap instead of adding up)."""
    async with anyio.create_task_group() as tg:
        for close in closes:
            tg.start_soon(close)


@contextmanager
def traced(role: str, op: str, *, to: str | None) -> Iterator[None]:
    """Trace a span of the server's own work (an op of no worker) to `to`: where a call's time goes between ops."""
    started = time.perf_counter()
    try:
        yield
    finally:
        trace(role, op, True, started, to=to)
