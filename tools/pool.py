"""Warm workers: processes that already imported torch and readied the device, waiting for a job.

A cold worker pays for the interpreter, `import torch` and the device context (3-5 s on a GPU host)
before it can load a candidate. The pool keeps a few such processes started ahead of time, per
backend that has been asked for, and hands each out exactly once: a warm worker serves one job and
dies with it, like a cold one, so candidates never share a process. It lives in the server's task
group (`run`); outside one (tests calling tools directly), workers start cold as before.

A warm worker is started with the settings every worker of this server shares (environment, network
isolation) plus its kind's extra environment (verify's candidate runs with CUDA_LAUNCH_BLOCKING=1,
which the CUDA runtime reads once, at start-up); what is per job (scratch directory, log, rlimits)
is sent when it is taken.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = ["WarmProcess", "WorkerPool"]

_WARM_TIMEOUT_S = 180.0
_Kind = tuple[str, tuple[tuple[str, str], ...]]  # backend, extra environment


def _kind(backend: str, extra_env: dict[str, str] | None) -> _Kind:
    return backend, tuple(sorted((extra_env or {}).items()))


class WarmProcess:
    """A started worker and its reply stream, not yet given a job."""

    def __init__(self, proc: anyio.abc.Process, out: BufferedByteReceiveStream) -> None:
        self.proc, self.out = proc, out


class WorkerPool:
    def __init__(self, home: Path, *, size: int, isolate_network: bool) -> None:
        self.home, self.size, self.isolate_network = home, size, isolate_network
        self._idle: dict[_Kind, list[WarmProcess]] = defaultdict(list)
        self._starting: dict[_Kind, int] = defaultdict(int)
        self._wanted: set[_Kind] = set()
        self._wake = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self.started = self.served = 0

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep `size` warm workers per wanted backend until cancelled; kill the idle ones on the way out."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                while True:
                    await self._wake.wait()
                    self._wake = anyio.Event()
                    self._refill()
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                for idle in self._idle.values():
                    for warm in idle:
                        await _kill(warm.proc)
                self._idle.clear()

    def want(self, backend: str, extra_env: dict[str, str] | None = None) -> None:
        """Start keeping warm workers of this kind (an available backend, or a kind just asked for)."""
        kind = _kind(backend, extra_env)
        if backend and self.size > 0 and kind not in self._wanted:
            self._wanted.add(kind)
            self._wake.set()

    def take(self, backend: str, extra_env: dict[str, str] | None = None) -> WarmProcess | None:
        """A warm worker of this kind, or None (then the caller starts a cold one)."""
        self.want(backend, extra_env)
        idle = self._idle.get(_kind(backend, extra_env))
        while idle:
            warm = idle.pop(0)
            if warm.proc.returncode is None:
                self.served += 1
                self._wake.set()
                return warm
        self._wake.set()
        return None

    def _refill(self) -> None:
        if self._tg is None:
            return
        for kind in self._wanted:
            missing = self.size - len(self._idle[kind]) - self._starting[kind]
            for _ in range(max(0, missing)):
                self._starting[kind] += 1
                self._tg.start_soon(self._start_one, kind)

    async def _start_one(self, kind: _Kind) -> None:
        from .runner import worker_env

        scratch = self.home / "cache" / "pool"
        scratch.mkdir(parents=True, exist_ok=True)
        proc = None
        try:
            backend, env = kind
            argv = [sys.executable, "-m", "kforge.tools.worker", "--warm", backend]
            if self.isolate_network:
                argv.append("--isolate-network")
            proc = await anyio.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, cwd=str(scratch),
                                            env=worker_env(self.home, scratch, dict(env)), start_new_session=True)
            out = BufferedByteReceiveStream(proc.stdout)
            with anyio.fail_after(_WARM_TIMEOUT_S):
                line = await out.receive_until(b"\n", 1 << 20)
            if b'"warm": true' not in line:  # could not import torch or ready the device: cold starts will say why
                await _kill(proc)
                self._wanted.discard(kind)
                return
            self._idle[kind].append(WarmProcess(proc, out))
            self.started += 1
            proc = None
        except (OSError, TimeoutError, anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
            self._wanted.discard(kind)  # stop trying; cold workers report the problem properly
        finally:
            self._starting[kind] -= 1
            if proc is not None:
                with anyio.CancelScope(shield=True):
                    await _kill(proc)


async def _kill(proc: anyio.abc.Process) -> None:
    import os
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    with anyio.move_on_after(5):
        await proc.wait()
    await proc.aclose()
