"""Warm workers: processes that already imported torch and readied the device, waiting for a job.

A cold worker pays for the interpreter, `import torch` and the device context (3-5 s on a GPU host)
before it can load a candidate. The pool keeps a few such processes ready ahead of time, per kind
that has been asked for, and hands each out exactly once: a warm worker serves one job and dies with
it, like a cold one, so candidates never share a process. It lives in the server's task group
(`run`); outside one (tests calling tools directly), workers start cold as before.

Warm workers are forked by a *zygote* per backend (`kforge.tools.harness.forkserver`), which paid for the
imports once, so a refill skips the interpreter and torch imports: it costs a fork, a device start and a
warm-up of the profiler (1-5 s on an H100 host, depending on load), all before any job waits on it. A
job that finds no idle worker waits for the next fork of its kind (`acquire`) rather than start a cold
worker, which would pay 4-5 s of start-up and then several seconds of first-use costs.

A forked worker gets its kind's extra environment before its device starts (verify's candidate runs
with CUDA_LAUNCH_BLOCKING=1, which the CUDA runtime reads once, at start-up); what is per job (log,
rlimits) is sent when it is taken. Its sandbox is made at the fork, before any job: it may write only a
directory of its own that the pool makes for it (`jobs/w-*`), which becomes the job's scratch for its role.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict, deque
from functools import partial
from pathlib import Path
from typing import Awaitable, Callable, Protocol

import anyio
from anyio.abc import UNIXSocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from kforge.backends.host import process_stat

from .channel import Channel, SocketBytes, close_socket_stream, raw_socket
from .host_holds import HostHolds
from .lifecycle import close_together, kill_group, killpg, scratch_name, session_members, trace, worker_env
from .protocol import ResetReply, ResetRequest
from .triton_seed import add_new, seed_dir

__all__ = ["ForkedProcess", "WarmProcess", "WorkerPool"]


class _KeptWorker(Protocol):
    """What the pool uses of a worker it keeps (`runner.WorkerProcess`, which imports this module)."""

    scratch: Path
    log: Path
    device_bytes: int
    role: str

    @property
    def alive(self) -> bool: ...
    def leave_job(self) -> None: ...
    def pause(self, stopped: bool) -> None: ...
    async def background_seen(self) -> list[str]: ...
    async def stopped(self, within_s: float = 1.0) -> bool: ...
    async def call(self, request: ResetRequest, *, stage: str, timeout_s: float | None = None) -> ResetReply: ...
    async def aclose(self) -> None: ...


logger = logging.getLogger(__name__)
_ZYGOTE_TIMEOUT_S = 180.0  # importing torch on a cold, busy machine
_FORK_TIMEOUT_S = 60.0  # a fork and a device start
_REAP_BEFORE_NEXT_BYTES = 4 * 2**30  # killed workers that held more device memory are gone before the next job
_FORK_TRIES = 3  # forks of a kind that fail in a row before the pool gives the kind up for the server's life
_WAIT_FOR_FORK_S = 30.0  # how long a job waits for a forked worker before it starts a cold one
_LIGHT_HOLD_IDLE = 2  # a verify's hold lets a kind with fewer idle workers refill: a profile takes two
# Workers kept for the next job of the same code (`give_back_kept`): a judge for the next job of its reference, a
# candidate for the next job of the same candidate code (compile, verify, profile of one candidate). Each kept one
# spares that job a fork, whose device context the host starts one at a time (16 at once took 4.2 s, ~0.12 s each,
# on 1 or 2 GPUs alike; 2x H200, bench/explore/fork_scaling.py, 2026-11-27), and the code's load.
# An agent's next candidate of a problem comes within minutes (a judge); a candidate's next step, within seconds.
_KEEP_S = {"judge": 300.0, "candidate": 120.0}
# Kept at most per role and kind (backend and GPU pin): a judge per problem in play, the oldest going first; a
# candidate per agent between its steps (each a stopped process holding a device context, ~0.5 GB of the GPU), the
# newest not kept when full: jobs run in the order they came, so the candidates kept first are the next ones served
# (20 candidates at once on one GPU with 8 kept, the oldest going: 45 candidate processes for 20, 2x H200).
_KEPT_PER_DEVICE = {"judge": 4, "candidate": 16}
_KEPT_MAX_BYTES = 2 * 2**30  # a worker whose job's ops reserved more is not kept: its problem wants the room
_RESET_S = 30.0  # a reset (a gc and an empty cache) took 0.3-0.6 s on an H200 host; far past it, nothing to keep
_KEPT_WAIT_S = 5.0  # a job waits this long at most for a kept worker still forgetting its last job
_HOST_HOLDS_POLL_S = 0.1  # how often a pool reads the host's other holds (`HostHolds`; a directory listing)
_Kind = tuple[str, tuple[tuple[str, str], ...]]  # backend, extra environment


def _kind(backend: str, extra_env: dict[str, str] | None) -> _Kind:
    return backend, tuple(sorted((extra_env or {}).items()))


class ForkedProcess:
    """The part of anyio's Process that WorkerProcess uses, for a worker the zygote forked.

    The zygote is the worker's parent, so the exit code comes from it (`_exited`); the worker leads its
    own process group, so killing the group by pid works as for a worker the server started.
    """

    def __init__(self, pid: int, channel: Channel) -> None:
        self.pid, self.returncode = pid, None
        self._channel = channel
        self._ended = anyio.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    async def wait(self) -> int:
        await self._ended.wait()
        return self.returncode  # type: ignore[return-value]

    async def aclose(self) -> None:
        await self._channel.aclose()


class WarmProcess:
    """A started worker, its channel and its own directory, not yet given a job."""

    def __init__(self, proc: ForkedProcess, channel: Channel, scratch: Path, notes: list[str] | None = None) -> None:
        self.proc, self.channel, self.scratch = proc, channel, scratch
        self.notes = notes or []  # what the worker said of its readying that went wrong short of failing it

    async def discard(self) -> None:
        """End a worker that got no job, and remove its directory."""
        await kill_group(self.proc)
        await self.proc.aclose()
        shutil.rmtree(self.scratch, ignore_errors=True)


class _Fork:
    """A fork under way: its worker is still readying its device, and a timing can stop it and let it go on.

    A profile waited 0.27 s for the refills that a verify's takes had started (two small GEMMs, H100 trace,
    2026-11-24): stopping them (SIGSTOP to the worker's group) takes their CPU and device work away from the
    timing at once, and they go on afterwards with the work they had done."""

    def __init__(self, kind: _Kind) -> None:
        self.kind = kind
        self.pid: int | None = None  # from the zygote's "forked" line
        self.scope: anyio.CancelScope | None = None  # the wait for its answer: its clock stops with the fork
        self._stopped_at: float | None = None
        self._left_s: float | None = None  # while stopped: what was left of the wait's deadline
        self._want_stopped = False
        self.stopped_s = 0.0  # how long it was kept stopped, in all
        self.phases: dict[str, float] = {}  # the worker's own account of its readying (setup, device, libraries)
        self.notes: list[str] = []  # ... and what went wrong short of failing it (`worker._warm_libraries`)

    def timed_by(self, scope: anyio.CancelScope) -> None:
        """The wait for this fork's answer. Its deadline does not run while the fork is stopped: a fork kept stopped
        through a long timing (a torch.compile baseline, or a job's whole profile) past the deadline read as one
        that could not start its device, and the pool gave the kind up for the server's life."""
        self.scope = scope
        if self._stopped_at is not None:
            self._freeze()

    def _freeze(self) -> None:
        if self.scope is not None and self._left_s is None:
            self._left_s = self.scope.deadline - anyio.current_time()
            self.scope.deadline = math.inf

    def forked(self, pid: int) -> None:
        self.pid = pid
        if self._want_stopped:
            self._signal(signal.SIGSTOP)

    @property
    def stopping(self) -> bool:
        """Asked to stop (`stop`), until it goes on."""
        return self._want_stopped

    def stop(self) -> None:
        self._want_stopped = True
        if self.pid is not None:
            self._signal(signal.SIGSTOP)

    def go_on(self) -> None:
        self._want_stopped = False
        if self._stopped_at is not None:
            self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        # The worker leads its own group once it called setsid, its sandbox's process included; just forked,
        # it may not have yet: then it is one process, in the zygote's group.
        delivered = False
        for send in (os.killpg, os.kill):
            try:
                send(self.pid, sig)  # type: ignore[arg-type]
                delivered = True
            except (ProcessLookupError, PermissionError):
                pass
        if not delivered:
            return
        if sig == signal.SIGSTOP and self._stopped_at is None:
            self._stopped_at = anyio.current_time()
            self._freeze()
        elif sig == signal.SIGCONT and self._stopped_at is not None:
            self.stopped_s += anyio.current_time() - self._stopped_at
            if self.scope is not None and self._left_s is not None:
                self.scope.deadline = anyio.current_time() + self._left_s
            self._stopped_at, self._left_s = None, None


def _doing(pid: int | None) -> str:
    """What a fork that gave no answer was doing: each process of its session, its state and where in the kernel it
    waits (for the pool's problem report: a fork that hangs must say where)."""
    def one(member: int) -> str:
        stat = process_stat(member)
        if stat is None:
            return f"{member} gone"
        try:
            wchan = Path(f"/proc/{member}/wchan").read_text().strip() or "-"
        except OSError:
            wchan = "?"
        return f"{member} {stat[0]} {stat[1]} {wchan}"
    if pid is None:
        return "not forked yet"
    return ", ".join(one(m) for m in sorted(set(session_members(pid)) | {pid}))


class _Zygote:
    """One backend's fork server: started once, then forks warm workers on request."""

    def __init__(self, proc: anyio.abc.Process, ctl: UNIXSocketStream) -> None:
        self.proc, self.ctl = proc, ctl
        self.lines = BufferedByteReceiveStream(SocketBytes(raw_socket(ctl)))  # the zygote's JSON lines: ready, then exit codes
        self.children: dict[int, ForkedProcess] = {}
        self._requested: deque[_Fork] = deque()  # forks asked for whose pid the zygote has not named yet
        self._asking = anyio.Lock()  # one request at a time: the "forked" lines come in the order of the requests
        self.phases: dict[str, float] = {}  # its preload's account of its start, by phase (`worker._preload`)

    @classmethod
    async def start(cls, backend: str, argv_extra: list[str], env: dict[str, str], cwd: Path) -> _Zygote | str:
        """The started zygote, or why it could not start."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = await anyio.open_process(
                [sys.executable, "-m", "kforge.tools.harness.worker", "--zygote", backend, *argv_extra], stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(cwd), env=env, start_new_session=True)
        finally:
            theirs.close()
        ctl = await UNIXSocketStream.from_socket(ours)
        zygote = cls(proc, ctl)
        try:
            with anyio.fail_after(_ZYGOTE_TIMEOUT_S):
                reply = json.loads(await zygote.lines.receive_until(b"\n", 1 << 16))
        except (TimeoutError, anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError,
                ValueError) as exc:
            reply = {"why": f"no answer ({type(exc).__name__})"}
        if not reply.get("ready"):
            await zygote.close()
            return f"the {backend} fork server could not start: {reply.get('why', 'no reason given')}"
        zygote.phases = reply.get("phases") or {}
        return zygote

    async def watch(self) -> None:
        """Pass each worker's exit code on to its ForkedProcess; when the zygote ends, its workers go too."""
        try:
            while True:
                msg = json.loads(await self.lines.receive_until(b"\n", 1 << 16))
                if "forked" in msg:
                    if self._requested:
                        self._requested.popleft().forked(int(msg["forked"]))
                    continue
                child = self.children.pop(msg.get("exited"), None)
                if child is not None:
                    child._exited(int(msg["code"]))
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, anyio.ClosedResourceError,
                OSError, ValueError):
            pass
        finally:
            for pid, child in self.children.items():
                killpg(pid)
                child._exited(-9)
            self.children.clear()

    async def fork(self, extra_env: dict[str, str], scratch: Path, under_way: _Fork,
                   triton_seed: Path | None = None) -> WarmProcess | str:
        """A new worker with this environment, its device started and `scratch` its only writable directory
        of the data directory, or why there is none. `under_way` learns its pid while it readies; `triton_seed`:
        Triton cache entries it copies into its own before it readies (`triton_seed.copy_into`)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            async with self._asking:
                self._requested.append(under_way)
                try:
                    await self.ctl.send_fds(b"f", [theirs.fileno()])
                except BaseException:
                    self._requested.remove(under_way)  # no "forked" line will come for it
                    raise
        finally:
            theirs.close()
        channel = await Channel.from_socket(ours)
        try:
            first = {"env": extra_env, "scratch": str(scratch),
                     **({"triton_seed": str(triton_seed)} if triton_seed is not None and triton_seed.is_dir() else {})}
            await channel.send((json.dumps(first) + "\n").encode())
            with anyio.fail_after(timeout_s := _FORK_TIMEOUT_S) as scope:
                under_way.timed_by(scope)
                reply = json.loads((await channel.receive_line(1 << 16))[0])
        except TimeoutError:
            reply = {"why": f"no answer in {timeout_s:.0f} s of running (and {under_way.stopped_s:.1f} s kept "
                            f"stopped); its processes (pid name state kernel-wait): {_doing(under_way.pid)}"}
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError, ValueError) as exc:
            reply = {"why": f"no answer ({type(exc).__name__})"}
        if not reply.get("warm"):
            await channel.aclose()  # the worker reads EOF and exits
            if under_way.pid is not None:
                killpg(under_way.pid)  # and one that hangs goes too
            return f"a forked worker could not start its device: {reply.get('why', 'no reason given')}"
        under_way.phases, under_way.notes = reply.get("phases") or {}, reply.get("notes") or []
        proc = ForkedProcess(int(reply["pid"]), channel)
        self.children[proc.pid] = proc
        return WarmProcess(proc, channel, scratch, under_way.notes)

    async def close(self) -> None:
        await close_socket_stream(raw_socket(self.ctl), self.ctl)  # EOF: the zygote kills the workers it still has and exits
        with anyio.move_on_after(5):
            await self.proc.wait()
        await kill_group(self.proc)


async def _discard_kept(worker: _KeptWorker) -> None:
    """End a kept worker and remove its directory (its own, no longer any job's)."""
    with anyio.CancelScope(shield=True):
        await worker.aclose()
    shutil.rmtree(worker.scratch, ignore_errors=True)


class WorkerPool:
    def __init__(self, home: Path, *, size: int, isolate_network: bool, max_size: int | None = None,
                 sandbox: list[str] | None = None, trace_file: str | None = None,
                 host_holds: HostHolds | None = None, max_forks: int = 0) -> None:
        self.home, self.size, self.isolate_network = home, size, isolate_network
        # Forks under way at once, all kinds together (0: no limit). The host starts device contexts one at a time
        # (~4 a second on any number of GPUs), so 32 forks started together all arrived 3.7-7.8 s later, where a few
        # at a time bring the first ones in about a second (2x H200, s22's traces); kinds a job waits for go first.
        self.max_forks = max_forks
        self.sandbox = sandbox or []  # the workers' `--sandbox` arguments (`limits.sandbox_args`)
        self.trace_file = trace_file  # `WorkerLimits.trace_file`: where its forks are traced
        # A kind asked for while none was idle keeps one more ready from then on, up to max_size: the pool
        # grows to the concurrency it sees (4 candidates at once want ~4 of each kind) instead of starving.
        self.max_size = max(size, max_size if max_size is not None else 4 * size)
        self._target: dict[_Kind, int] = defaultdict(lambda: self.size)
        self._idle: dict[_Kind, list[WarmProcess]] = defaultdict(list)
        self._starting: dict[_Kind, int] = defaultdict(int)
        self._wanted: set[_Kind] = set()
        self._taken: set[_Kind] = set()  # kinds a job has taken a worker of (`take`): beside a verify, only they refill
        self._zygotes: dict[str, _Zygote | str] = {}  # a str: why it could not start; workers start cold
        self.problems: list[str] = []  # why warm workers of some kind are not offered (also logged)
        self._failed: Counter[_Kind] = Counter()  # forks of a kind that failed in a row (`_FORK_TRIES`)
        self._zygote_locks: dict[str, anyio.Lock] = defaultdict(anyio.Lock)
        self._waiting: dict[_Kind, int] = defaultdict(int)  # jobs waiting for a fork of this kind
        self._refills_after = 0.0  # `defer_refills`: until then (time.monotonic()), only forks a job waits for start
        self._changed: dict[_Kind, anyio.Event] = defaultdict(anyio.Event)  # a worker arrived, or the kind was dropped
        self._wake = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self.started = self.served = 0
        # Holds in progress (`hold_forks`), by weight (light or not): timings and verifies about to start or running,
        # during which no new fork starts
        self._holds: Counter[bool] = Counter()
        # The holds of the host's other KForge processes (`HostHolds`: servers, a fleet's node agents), (full, light),
        # read every `_HOST_HOLDS_POLL_S` while the pool runs; this pool's own are published there.
        self.host_holds = host_holds or HostHolds()
        self._others: tuple[bool, bool] = (False, False)
        self._under_way: set[_Fork] = set()  # forks readying their device (`pause_forks` stops them)
        self._fork_ended = anyio.Event()  # a fork under way ended (`quiet`)
        self._reaping = self._reaping_bytes = 0  # jobs' killed workers whose exits are still awaited (`reap`)
        self._reaped = anyio.Event()
        # Workers kept for the next job of the same code (`give_back_kept`), by key (role, backend, GPU pin, the
        # code's sha256): (when kept, the worker).
        self._kept: dict[tuple[str, ...], list[tuple[float, _KeptWorker]]] = defaultdict(list)
        self.kept: Counter[str] = Counter()  # by role: workers kept so far
        self.reused: Counter[str] = Counter()  # by role: jobs served by a kept worker
        self._resetting: Counter[tuple[str, ...]] = Counter()  # workers given back whose reset is under way, by key
        self._kept_settled: dict[tuple[str, ...], anyio.Event] = defaultdict(anyio.Event)  # one was kept or dropped

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep warm workers per wanted kind (`size`, growing on misses) until cancelled; kill idle ones on exit."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._expire_kept)
                tg.start_soon(self._watch_host_holds)
                task_status.started()
                while True:
                    await self._wake.wait()
                    self._wake = anyio.Event()
                    self._refill()
        finally:
            self._tg = None
            self.host_holds.close()
            self._wanted.clear()
            for kind in list(self._changed):
                self._changed_now(kind)  # waiting jobs start cold workers instead
            with anyio.CancelScope(shield=True):
                for idle in self._idle.values():
                    for warm in idle:
                        await warm.discard()
                self._idle.clear()
                kept = [worker for parked in self._kept.values() for _, worker in parked]
                self._kept.clear()
                await close_together([partial(_discard_kept, worker) for worker in kept])
                for zygote in self._zygotes.values():
                    if isinstance(zygote, _Zygote):
                        await zygote.close()
                self._zygotes.clear()

    async def take_kept(self, key: tuple[str, ...]) -> _KeptWorker | None:
        """A worker kept by an earlier job of the same code on the same kind of worker (`key`: role, backend, GPU
        pin, the code's sha256), or None. One given back whose reset is still under way (0.3-0.6 s on an H200 host:
        an agent's profile follows its verify at once) is waited for, up to `_KEPT_WAIT_S`."""
        with anyio.move_on_after(_KEPT_WAIT_S):
            while True:
                parked = self._kept.get(key)
                while parked:
                    _, worker = parked.pop()  # the most recent: the others may expire
                    if worker.alive:
                        worker.pause(False)
                        self.reused[worker.role] += 1
                        return worker
                    if self._tg is not None:
                        self._tg.start_soon(_discard_kept, worker)
                if not self._resetting[key]:
                    return None
                await self._kept_settled[key].wait()
        return None

    def has_kept(self, key: tuple[str, ...]) -> bool:
        """Whether a worker is kept, or being reset to be kept, under `key`."""
        return bool(self._kept.get(key)) or bool(self._resetting.get(key))

    def kept_pins(self, role: str, backend: str, sha256: str) -> set[str]:
        """The GPU pins (`gpus.pin_key`) where a worker of this role, backend and code is kept or being reset."""
        keys = [k for k, parked in self._kept.items() if parked] + list(self._resetting)  # (a key at 0 is deleted)
        return {k[2] for k in keys if (k[0], k[1], k[3]) == (role, backend, sha256)}

    def give_back_kept(self, key: tuple[str, ...], worker: _KeptWorker, *, any_peak: bool = False) -> bool:
        """Keep a warm worker whose job ended well for the next job of the same code (`take_kept`); False when the
        pool is not running (the caller ends it). It forgets the job first (`ResetRequest`) and is kept only if that
        works and its problem is small (`_KEPT_MAX_BYTES`): its job's peak, unless `any_peak` (a judge that compiled
        a large problem ahead for its profile), and what it still reserves after the reset.

        A judge never runs candidate code: it holds the reference, and the outputs handed to it are plain tensors it
        rebuilt (`harness.handoff`). A candidate serves only jobs of its own code (the key holds its sha256), never
        another candidate's, and only after a job it passed; while kept it is stopped (SIGSTOP to its process group),
        so nothing of it runs beside another job's timing."""
        if self._tg is None:
            return False
        worker.leave_job()
        self._resetting[key] += 1
        self._tg.start_soon(self._keep, key, worker, any_peak)
        return True

    async def _keep(self, key: tuple[str, ...], worker: _KeptWorker, any_peak: bool) -> None:
        kept = False
        try:
            kept = await self._reset_and_keep(key, worker, any_peak)
        finally:
            self._resetting[key] -= 1
            if not self._resetting[key]:
                del self._resetting[key]
            self._kept_settled.pop(key, anyio.Event()).set()  # its waiters look again; the next round gets a new event
            if not kept:
                await _discard_kept(worker)

    async def _reset_and_keep(self, key: tuple[str, ...], worker: _KeptWorker, any_peak: bool) -> bool:
        if worker.device_bytes > _KEPT_MAX_BYTES and not any_peak:
            return False
        try:
            reply = await worker.call(ResetRequest(), stage="reset", timeout_s=_RESET_S)
        except Exception:  # noqa: BLE001 - a worker that cannot forget its job is not kept
            return False
        if reply.failure is not None or reply.reserved_bytes > _KEPT_MAX_BYTES or self._tg is None:
            return False
        worker.device_bytes = 0
        try:  # the next job's failures quote the log's tail: not this job's lines (the worker appends: O_APPEND)
            worker.log.write_bytes(b"")
        except OSError:
            pass
        if worker.role == "candidate":
            # Anything of its own still running (a process it started, a thread that kept running) could run beside
            # another job's timing while it is kept, where its job's checks did not look (a compile judges nothing).
            if await worker.background_seen():
                return False
            worker.pause(True)
            if not await worker.stopped():
                return False
        parked = self._kept[key]
        same_kind = [p for k, v in self._kept.items() if k[:3] == key[:3] for p in v]
        if len(same_kind) >= _KEPT_PER_DEVICE[worker.role]:
            if worker.role == "candidate":
                return False
            oldest = min(same_kind, key=lambda p: p[0])
            for v in self._kept.values():
                if oldest in v:
                    v.remove(oldest)
            self._tg.start_soon(_discard_kept, oldest[1])
        parked.append((time.monotonic(), worker))
        self.kept[worker.role] += 1
        return True

    async def _expire_kept(self) -> None:
        while True:
            await anyio.sleep(10.0)
            now = time.monotonic()
            for key, parked in list(self._kept.items()):
                for item in [p for p in parked if now - p[0] > _KEEP_S[p[1].role] or not p[1].alive]:
                    parked.remove(item)
                    await _discard_kept(item[1])
                if not parked:
                    self._kept.pop(key, None)

    def hold_forks(self, light: bool = False) -> Callable[[], None]:
        """Start no fork until the returned release is called (once or more), except forks a job waits for.

        A fork starts a device context and warms the libraries (~1.3 s of GPU and CPU work on an H100):
        beside a timing it slowed the timed calls 2-3x (a profile's first round, H100 trace, 2026-11-24). A
        profile holds this from the moment it takes its workers until it is done with the device, so the
        refills its takes ask for start after it, and stops the forks already under way (`pause_forks`)
        before timing.

        `light` (a verify): kinds with fewer than `_LIGHT_HOLD_IDLE` idle workers still refill, up to that many, if
        a job has taken workers of them. Forks beside a verify slowed its first trials 2-3x on small GEMMs, and two
        of them held 2.3 GB of device memory during a 4.3 GB problem's verify; but a verify that held every refill
        left the profile after it waiting 0.4-1.2 s for its workers (H100, 2026-11-24). Refilled to their full
        targets, and kinds no job had used yet, a fresh server's first cpu verify ran beside 7 forks and a fork
        server on 2 cores (2-core VM, s26: its trials took 8.2 s of its 12.6 s); and every slow verify trial of
        the two-GPU runs (s25) ran beside forks.

        A hold covers every GPU of the host, not only its job's: the driver starts device contexts one at a time
        host-wide, and its allocations, mappings and frees wait behind them on every GPU. With holds per GPU, one
        GPU's refills ran beside the other's verifies, whose trials (exported outputs, imports, resets) took
        0.11 s at the median against 0.015 s with holds on the host (2x H200, 4 clients x 5 ReLU candidates:
        60.6 against 70.4 candidates per minute; `bench/results`, s20)."""
        self._holds[light] += 1
        self._publish()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._holds[light] -= 1
                if not self._holds[light]:
                    del self._holds[light]
                self._publish()
                if not self._quiet and not any(self._others):
                    for fork in self._under_way:
                        fork.go_on()
                self._wake.set()
        return release

    def _publish(self) -> None:
        self.host_holds.publish("full" if self._holds[False] else "light" if self._holds[True] else None)

    async def _watch_host_holds(self) -> None:
        """Follow the host's other holds (`HostHolds`): forks under way stop while another process of the host times
        or verifies, as they do for this pool's own jobs, and go on (refills too) once none holds."""
        while True:
            await anyio.sleep(_HOST_HOLDS_POLL_S)
            others = self.host_holds.others()  # a listing of a few entries in memory: no thread needed
            if others == self._others:
                continue
            self._others = others
            if any(others):
                self.pause_forks(light=not others[0])
            elif not self._quiet:
                for fork in self._under_way:
                    fork.go_on()
            self._wake.set()

    @property
    def _quiet(self) -> int:
        """Holds in progress, of every kind."""
        return sum(self._holds.values())

    def _covered(self, light: bool | None = None) -> bool:
        """Whether a hold of this weight (None: of either) is in progress (`hold_forks`), here or elsewhere on the host
        (`HostHolds`)."""
        full, light_elsewhere = self._others
        if light is None:
            return bool(self._quiet) or full or light_elsewhere
        return bool(self._holds[light]) or (light_elsewhere if light else full)

    def pause_forks(self, light: bool = False) -> None:
        """Stop the forks under way until every hold is released (`hold_forks`; call this while holding). They
        keep what they readied and go on afterwards, or as soon as a job waits for a worker of their kind; a
        kind some job already waits for is not stopped, nor, if `light`, one that jobs took from, short of idle
        workers."""
        for fork in self._under_way:
            if not self._waiting[fork.kind] and not (light and self._refills_beside_verify(fork.kind)):
                fork.stop()

    def _short(self, kind: _Kind) -> bool:
        return len(self._idle[kind]) < _LIGHT_HOLD_IDLE

    def _refills_beside_verify(self, kind: _Kind) -> bool:
        """A verify's light hold lets this kind's forks start and go on: jobs took from it, and it is short."""
        return kind in self._taken and self._short(kind)

    def reap(self, closes: list[Callable[[], Awaitable[None]]], device_bytes: int) -> bool:
        """Await killed workers' exits in the background (each a device context's teardown, 0.15-0.2 s on an
        H100), so a job answers without waiting for them; False when the pool is not running (await them).
        `device_bytes`: the memory they held; over `_REAP_BEFORE_NEXT_BYTES`, the next job waits for it."""
        if self._tg is None:
            return False
        self._reaping += 1
        self._reaping_bytes += device_bytes
        self._tg.start_soon(self._reap, closes, device_bytes)
        return True

    async def _reap(self, closes: list[Callable[[], Awaitable[None]]], device_bytes: int) -> None:
        try:
            with anyio.CancelScope(shield=True):  # a server shutting down still collects what it killed
                await close_together(closes)
        finally:
            self._reaping -= 1
            self._reaping_bytes -= device_bytes
            if not self._reaping:
                self._reaped.set()
                self._reaped = anyio.Event()

    async def quiet(self, timeout_s: float = _KEPT_WAIT_S) -> None:
        """Wait, up to `timeout_s`, until no worker given back is still being reset, no killed one is still exiting,
        and no fork readies a device unstopped (after `pause_forks`: one a job waits for): their frees, unmaps and
        device-context starts and teardowns run on the device beside whatever else does. A warm-up's timing ahead
        that started as the profile before it gave its workers back read eager 11.7% slower than that profile had
        (8192x8192 ReLU, H200, 2026-12-02), and one beside the forks the next verify waited for 12.2% slower
        (level2/80, H200, s36), so its torch.compile could not be compared."""
        with anyio.move_on_after(timeout_s):
            while self._resetting or self._reaping or self._forks_going_on():
                if self._resetting:
                    await self._kept_settled[next(iter(self._resetting))].wait()
                elif self._reaping:
                    await self._reaped.wait()
                else:
                    await self._fork_ended.wait()

    def _forks_going_on(self) -> bool:
        return any(not fork.stopping for fork in self._under_way)

    async def reaped(self) -> None:
        """Wait until the last jobs' workers are gone if they held much device memory: a new job of several GB
        must find it free. Small ones are not waited for (a back-to-back call would wait ~0.15 s for nothing)."""
        with anyio.move_on_after(10):
            while self._reaping and self._reaping_bytes > _REAP_BEFORE_NEXT_BYTES:
                await self._reaped.wait()

    def prestart(self, backend: str) -> None:
        """Start a backend's fork server before any of its kinds is wanted (beside the server's probe): on a fresh
        server its imports are the first worker's longest wait. `drop_zygote` ends one the probe did not confirm."""
        async def start() -> None:
            try:
                await self._zygote(backend)
            except Exception as exc:  # noqa: BLE001 - as in `_start_one`: the first fork of its kind tries again
                logger.warning("the %s fork server could not start ahead: %s", backend, exc)

        if self._tg is not None and self.size > 0 and backend not in self._zygotes:
            self._tg.start_soon(start)

    async def drop_zygote(self, backend: str) -> None:
        """End a backend's fork server when none of its kinds is wanted (a prestarted one whose backend the probe found
        unavailable here)."""
        if any(kind[0] == backend for kind in self._wanted):
            return
        async with self._zygote_locks[backend]:
            zygote = self._zygotes.pop(backend, None)
        if isinstance(zygote, _Zygote):
            await zygote.close()

    def defer_refills(self, seconds: float) -> None:
        """For `seconds`, start only forks that jobs wait for: a job that waited for the server's first probe is
        on its way to ask for its workers, and the refills of every kind the probe confirmed, started first, would
        delay them (`_refill`)."""
        self._refills_after = max(self._refills_after, time.monotonic() + seconds)
        if self._tg is not None:
            self._tg.start_soon(self._wake_after, seconds)

    async def _wake_after(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        self._wake.set()

    def want(self, backend: str, extra_env: dict[str, str] | None = None) -> None:
        """Start keeping warm workers of this kind (an available backend, or a kind just asked for)."""
        kind = _kind(backend, extra_env)
        if backend and self.size > 0 and kind not in self._wanted:
            self._wanted.add(kind)
            self._wake.set()

    def take(self, backend: str, extra_env: dict[str, str] | None = None) -> WarmProcess | None:
        """A warm worker of this kind, or None (then the caller starts a cold one)."""
        self.want(backend, extra_env)
        kind = _kind(backend, extra_env)
        self._taken.add(kind)
        warm = self._pop_idle(kind)
        # A miss keeps one more of the kind, up to max_size. So does a take that leaves it short for a profile's
        # two takes, but only up to one over the pool's size: each idle GPU worker holds ~1.15 GB of device memory
        # that a large problem needs. Jobs back to back (a verify, then a profile) otherwise meet forks beside
        # them or wait for them (H100, 2026-11-24).
        if kind in self._wanted and (warm is None or (self._short(kind) and self._target[kind] <= self.size)):
            self._target[kind] = min(self.max_size, self._target[kind] + 1)
        self._wake.set()
        return warm

    async def acquire(self, backend: str, extra_env: dict[str, str] | None = None,
                      wait_s: float = _WAIT_FOR_FORK_S) -> WarmProcess | None:
        """A warm worker of this kind, waiting for a fork when none is idle; None: start a cold one.

        A fork arrives with its device started and profiler warmed, usually sooner than a cold worker
        would start (4-5 s), and a cold worker then pays several seconds of first-use costs (H100
        traces in bench/results), so waiting wins.
        """
        await self.reaped()
        warm = self.take(backend, extra_env)
        kind = _kind(backend, extra_env)
        if warm is not None or self._tg is None:
            return warm
        self._waiting[kind] += 1
        for fork in self._under_way:
            if fork.kind == kind:
                fork.go_on()  # a job that cannot go on without it comes before a timing's quiet
        self._wake.set()
        try:
            with anyio.move_on_after(wait_s):
                while kind in self._wanted:
                    await self._changed[kind].wait()
                    if (warm := self._pop_idle(kind)) is not None:
                        return warm
        finally:
            self._waiting[kind] -= 1
            self._wake.set()  # the refills held back while it waited
        return None

    async def take_when_idle(self, backend: str, extra_env: dict[str, str] | None = None,
                             wait_s: float = _WAIT_FOR_FORK_S) -> WarmProcess | None:
        """A warm worker of this kind as soon as one is idle, within `wait_s`, or None. Unlike `acquire`, the wait
        asks for nothing: no fork goes on beside a hold for it, and the kind's target stays (for work no call waits
        for, `kforge.tools.warmup`: it takes what the refills of the jobs' own takes bring)."""
        kind = _kind(backend, extra_env)
        with anyio.move_on_after(wait_s):
            while kind in self._wanted:
                if (warm := self._pop_idle(kind)) is not None:
                    self._wake.set()
                    return warm
                await self._changed[kind].wait()
        return None

    def _pop_idle(self, kind: _Kind) -> WarmProcess | None:
        idle = self._idle.get(kind)
        while idle:
            warm = idle.pop(0)
            if warm.proc.returncode is None:
                self.served += 1
                self._wake.set()
                return warm
            shutil.rmtree(warm.scratch, ignore_errors=True)  # died idle
        return None

    def _changed_now(self, kind: _Kind) -> None:
        self._changed.pop(kind, anyio.Event()).set()  # wakes this round's waiters; the next round gets a new event

    def settled(self) -> bool:
        """Some kind is wanted and every wanted kind has its target of warm workers idle (a server that ran a while)."""
        return bool(self._wanted) and all(len(self._idle[kind]) >= self._target[kind] for kind in self._wanted)

    def _refill(self) -> None:
        if self._tg is None:
            return
        room = self.max_forks - sum(self._starting.values()) if self.max_forks else None
        # While a job waits for a fork, only forks some job waits for start: the host starts device contexts one at a
        # time, so refills started beside them delay them. A fresh server's first verify waited 4.1-4.5 s for its
        # two forks among 12 refills started with them (2x H200, s25 first_call trace); one alone takes ~1.2 s.
        jobs_wait = any(self._waiting[kind] > 0 for kind in self._wanted) or time.monotonic() < self._refills_after
        beside_verify = self._covered(light=True) and not self._covered(light=False)
        for kind in sorted(self._wanted, key=lambda k: -self._waiting[k]):  # kinds a job waits for first
            held = self._covered(light=False) or (beside_verify and not self._refills_beside_verify(kind))
            target = 0 if held or jobs_wait else self._target[kind]  # then, only forks a job waits for
            if beside_verify:  # only the workers a profile after it takes; the rest once it is done
                target = min(target, _LIGHT_HOLD_IDLE)
            missing = target + self._waiting[kind] - len(self._idle[kind]) - self._starting[kind]
            if room is not None:
                missing = min(missing, room)
                room -= max(0, missing)
            for _ in range(max(0, missing)):
                self._starting[kind] += 1
                self._tg.start_soon(self._start_one, kind)

    async def _zygote(self, backend: str) -> _Zygote | str:
        async with self._zygote_locks[backend]:
            if backend not in self._zygotes:
                scratch = self.home / "cache" / "pool"
                scratch.mkdir(parents=True, exist_ok=True)
                extra = ["--isolate-network"] if self.isolate_network else []
                extra += self.sandbox
                started = time.perf_counter()
                zygote = await _Zygote.start(backend, extra, worker_env(self.home, scratch), scratch)
                # Its start, the first fork of its backend's wait: its imports and preloads by phase.
                trace("pool", f"zygote {backend}", isinstance(zygote, _Zygote), started, to=self.trace_file,
                      phases=zygote.phases if isinstance(zygote, _Zygote) else {})
                self._zygotes[backend] = zygote
                if isinstance(zygote, _Zygote) and self._tg is not None:
                    self._tg.start_soon(zygote.watch)
            return self._zygotes[backend]

    async def _start_one(self, kind: _Kind) -> None:
        backend, env = kind
        started = time.perf_counter()
        own = self.home / "jobs" / scratch_name("w")
        under_way = _Fork(kind)
        self._under_way.add(under_way)
        try:
            zygote = await self._zygote(backend)
            own.mkdir(mode=0o700, parents=True)
            seed = seed_dir(self.home)
            warm = await zygote.fork(dict(env), own, under_way, seed) if isinstance(zygote, _Zygote) else zygote
            # What its readying compiled (the fused compare) goes to the seed, before any job runs in it; shielded (a
            # few ms), so a cancel cannot land between the worker's making and its place in the pool.
            seeded: list[str] = []
            if not isinstance(warm, str):
                with anyio.CancelScope(shield=True):
                    seeded = await anyio.to_thread.run_sync(add_new, own / "triton", seed)
            trace("pool", "fork " + " ".join([backend, *(f"{k}={v}" for k, v in env)]), True, started,
                  to=self.trace_file, stopped_s=round(under_way.stopped_s, 3), pid=under_way.pid,
                  phases=under_way.phases, **({"notes": under_way.notes} if under_way.notes else {}),
                  **({"triton_seeded": seeded} if seeded else {}))
        except Exception as exc:  # noqa: BLE001 - a pool that cannot warm must not take the server down
            warm = f"{type(exc).__name__}: {exc}"
        except BaseException:  # cancelled mid-fork (the pool's end): the half-made worker goes, and its directory
            if under_way.pid is not None:
                killpg(under_way.pid)
            shutil.rmtree(own, ignore_errors=True)
            raise
        finally:
            self._under_way.discard(under_way)
            under_way.go_on()  # (a fork that failed while stopped must not stay stopped)
            self._fork_ended.set()
            self._fork_ended = anyio.Event()
            self._starting[kind] -= 1
            if self.max_forks:
                self._wake.set()  # room for a fork held back by the limit
        if isinstance(warm, str):
            shutil.rmtree(own, ignore_errors=True)
            self._failed[kind] += 1
            if self._failed[kind] < _FORK_TRIES and kind in self._wanted:
                # One slow or stuck fork (a busy 2-core CI machine's) must not cost the server its warm workers.
                logger.warning("a warm worker for %s %s failed (%d of %d tries in a row): %s", backend,
                               dict(env) or "", self._failed[kind], _FORK_TRIES, warm)
                self._wake.set()
                return
            # stop trying; cold workers report the problem properly
            self._wanted.discard(kind)
            self.problems.append(f"{backend} {dict(env) or ''}: {warm}")
            logger.warning("no warm workers for %s %s, workers start cold: %s", backend, dict(env) or "", warm)
            self._changed_now(kind)
            return
        self._failed[kind] = 0
        self._idle[kind].append(warm)
        self.started += 1
        self._changed_now(kind)
