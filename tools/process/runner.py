"""Parent side of the worker protocol: start a worker, call its ops with deadlines, clean up.

Every worker runs in its own process group with a scrubbed environment (an allowlist, so server
secrets such as tokens and API keys never reach candidate code), its own scratch directory, and
rlimits set by the worker before user code runs. A timeout, crash or early exit becomes a
`WorkerDied` carrying a `Failure` (signal, exit code, the last lines of output); a cancelled call
kills the whole process group.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from kforge.backends.host import process_ids, process_stat

from ..disk import mark_loaded
from ..models import Failure
from .build_service import serve_build_request, spawn_pch_build
from .channel import Channel, HandedFds, close_all
from .lifecycle import (Preemption, busy_threads, close_together, kill_group, killpg, namespace_pids, namespace_processes,
                        preemptions, sandboxed_worker, session_members, trace, worker_env)
from .limits import WorkerLimits, confinement, sandbox_args
from .protocol import LoadReply, ProtocolError, R, Request, WorkerInit, WorkerRole, parse_reply

if TYPE_CHECKING:
    from .pool import ForkedProcess, WorkerPool

__all__ = ["HarnessError", "NoIdleWorker", "ProtocolViolation", "WorkerDied", "WorkerGroup", "WorkerProcess"]

_READY_TIMEOUT_S = 180.0  # importing torch on a cold, busy machine
_TAIL_LINES = 30
# Descriptors workers sent (a candidate's CPU outputs), held until a call hands them to another worker.
HANDED = HandedFds()


class WorkerDied(Exception):
    """The worker stopped answering: it timed out, crashed or exited. `failure` says which."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(str(failure))
        self.failure = failure


class NoIdleWorker(RuntimeError):
    """A `warm_only` worker found no warm worker idle in the pool."""


class HarnessError(RuntimeError):
    """KForge's own worker code failed (a bug, not the candidate's fault)."""


class ProtocolViolation(HarnessError):
    """A reply that does not fit its op's reply model (`kforge.tools.process.protocol`): a harness bug."""


def _tail(path: Path, n: int = _TAIL_LINES) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    lines = text.rstrip().splitlines()[-n:]
    return "\n".join(lines) or None


def _describe_exit(code: int) -> tuple[str, str]:
    if code < 0:
        sig = signal.Signals(-code)
        if sig == signal.SIGKILL:
            return "crashed", "killed by SIGKILL (the kernel's out-of-memory killer, or an external kill)"
        desc = signal.strsignal(sig) or sig.name
        return "crashed", f"killed by {sig.name} ({desc.lower()})"
    return "exited", f"the process exited with code {code} before answering (os._exit, exit() in native code, or abort handling)"


class WorkerGroup:
    """The workers of one job, ended together: every one is killed at once, then their exits (a GPU
    context's teardown each) are awaited side by side, by the pool in the background where one runs (the
    job answers without waiting; the next job waits only if they held much device memory), else here.

    A judge or candidate marked `give_back` goes back to the pool instead when the job ends without an exception,
    for the next job of the same code (`WorkerPool.give_back_kept`); one the job was given (`adopt`) ends like the
    others otherwise."""

    def __init__(self, pool: WorkerPool | None = None) -> None:
        self.workers: list[WorkerProcess] = []
        self._pool = pool
        self._give_back: dict[int, tuple[WorkerProcess, tuple[str, ...], bool]] = {}

    async def start(self, worker: WorkerProcess) -> WorkerProcess:
        self.workers.append(worker)
        return await worker.__aenter__()

    def adopt(self, worker: WorkerProcess, link: Path) -> WorkerProcess:
        """A worker started before this job (kept by the pool), from now on one of the group's; `link`, where the job
        looks for the role's directory, points to the worker's own (removed with the job's unless given back again)."""
        link.symlink_to(worker.scratch, target_is_directory=True)
        worker.job_link = link
        self.workers.append(worker)
        return worker

    def give_back(self, worker: WorkerProcess, key: tuple[str, ...], *, any_peak: bool = False) -> None:
        """Hand this warm judge or candidate back to the pool under `key` if the job ends without an exception;
        `any_peak`: kept whatever its job reserved at its peak, if its reset leaves it small (`give_back_kept`)."""
        if self._pool is not None and worker.warm and worker.role in ("judge", "candidate") \
                and not worker.under_profiler:
            self._give_back[id(worker)] = (worker, key, any_peak)

    async def __aenter__(self) -> WorkerGroup:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            if exc_type is None and self._pool is not None:
                for worker, key, any_peak in self._give_back.values():
                    if worker.alive and self._pool.give_back_kept(key, worker, any_peak=any_peak):
                        self.workers.remove(worker)
            for worker in self.workers:
                worker.kill_now()
            held = sum(w.device_bytes for w in self.workers)
            closes = [w.aclose for w in self.workers]
            if self._pool is None or not self._pool.reap(closes, held):
                await close_together(closes)


class WorkerProcess:
    """`async with WorkerProcess(...) as w: await w.call(LoadRequest(role="candidate", source=...), stage="load")`."""

    def __init__(self, *, backend: str, home: Path, scratch: Path, limits: WorkerLimits,
                 extra_env: dict[str, str] | None = None, role: WorkerRole = "candidate", prefix: list[str] | None = None,
                 pool: WorkerPool | None = None, place: str = "", warm_only: bool = False) -> None:
        self.backend, self.home, self.scratch, self.limits = backend, home, scratch, limits
        # Only a warm worker, the next to come idle, without asking for a fork (work no call waits for: a fork asked
        # for goes on beside the job's hold); none within the pool's wait raises `NoIdleWorker`.
        self.warm_only = warm_only
        self.place = place  # where it runs on a host of several GPUs (`gpus.pin_key`), for the trace
        self.role = role
        self.log = scratch / f"{role}.log"
        self._extra_env = extra_env
        self._prefix = prefix or []  # e.g. ncu: the worker runs under a profiler
        self._proc: anyio.abc.Process | ForkedProcess | None = None
        self.kernel_names: list[str] = []
        self._channel: Channel | None = None
        self._handed: list[str] = []  # descriptors it sent that the server holds (`HANDED`) until handed on
        self.network = "host"  # what the worker reported: "isolated" or why not
        self.isolation: dict[str, list[str]] = {"applied": [], "missing": []}  # its sandbox (`kforge.tools.process.sandbox`)
        # A worker under a profiler (ncu) needs its own process; the others may come warm.
        self._pool = pool if not prefix else None
        self.warm = False
        self.device_bytes = 0  # the most device memory its ops reserved (their reported peaks)
        self.job_link: Path | None = None  # a warm worker's: the job's link to its own directory
        self._worker_pid: int | None = None  # under a profiler: the worker's own process, found at its start
        self.loaded: Any = None  # a candidate's `LoadReply`: what a later job of the same code, kept, reports as its build
        self.kept_key: tuple[str, ...] | None = None  # a candidate's key for the pool's kept workers (`steps.kept_key`)

    def _command(self) -> list[str]:
        """The worker's command line. Under a profiler (ncu), the profiler's front-end and the worker share one
        sandbox, entered before the front-end starts (`kforge.tools.process.profiled_launch`, which sends its report first):
        they talk through an abstract socket and FIFOs in /tmp, which two sandboxes would part. The worker itself
        then enters none (no `--sandbox`): a second one inside would part it from its profiler. It applies Landlock
        itself (`--landlock`, `sandbox.apply_landlock`): the CUDA driver writes the worker's own /proc/self/task."""
        worker = [sys.executable, "-m", "kforge.tools.harness.worker"]
        if not self._prefix:
            return [*worker, *sandbox_args(self.home, self.limits, self.scratch)]
        if (conf := confinement(self.home, self.limits, self.scratch)) is None:
            return [*self._prefix, *worker]
        return [sys.executable, "-m", "kforge.tools.process.profiled_launch", conf.as_arg(), "--", *self._prefix, *worker,
                "--landlock", conf.as_arg()]

    def _profiled_worker(self) -> int | None:
        """The worker's own process under a profiler: the descendant of the process started that runs
        `-m kforge.tools.harness.worker` (the sandbox's outer process, ncu and its launcher lie between). Looked up once
        it answered, before any candidate code ran that could look the same."""
        assert self._proc is not None
        children: dict[int, list[int]] = {}
        for pid in process_ids():
            if (st := process_stat(pid)) is not None:
                children.setdefault(st[2], []).append(int(pid))
        todo = [self._proc.pid]
        while todo:
            pid = todo.pop()
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"kforge.tools.harness.worker"]:
                    return pid
            except OSError:
                pass
            todo += children.get(pid, [])
        return None

    def _trace(self, op: str, started: float, peak_bytes: list[int] | None = None) -> None:
        trace(self.role, op, self.warm, started, peak_bytes, to=self.limits.trace_file, on=self.place,
              pid=self._proc.pid if self._proc is not None else None)

    async def __aenter__(self) -> WorkerProcess:
        started = time.perf_counter()
        self.scratch.parent.mkdir(parents=True, exist_ok=True)
        (self.home / "cache" / "builds").mkdir(parents=True, exist_ok=True)
        if self.warm_only:
            warm = await self._pool.take_when_idle(self.backend, self._extra_env) if self._pool is not None else None
            if warm is None:
                raise NoIdleWorker(f"no warm {self.backend} worker came idle")
        else:
            warm = (await self._pool.acquire(self.backend, self._extra_env)
                    if self._pool is not None and self.backend and not self.scratch.exists() else None)
        if warm is not None:
            # Its sandbox was made before this job: its own directory becomes the role's scratch (a link from
            # where the job looks for it: the job's directory is removed with what it links to).
            self.scratch.symlink_to(warm.scratch, target_is_directory=True)
            self.job_link = self.scratch
            self.scratch, self.log = warm.scratch, warm.scratch / f"{self.role}.log"
            self._proc, self._channel, self.warm = warm.proc, warm.channel, True
        else:
            self.scratch.mkdir(exist_ok=True)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with open(self.log, "ab") as errlog:
                    self._proc = await anyio.open_process(
                        self._command(), stdin=theirs.fileno(), stdout=errlog, stderr=errlog, cwd=str(self.scratch),
                        env=worker_env(self.home, self.scratch, self._extra_env), start_new_session=True)
            finally:
                theirs.close()
            self._channel = await Channel.from_socket(ours)
        init = WorkerInit(role=self.role, backend=self.backend, scratch=str(self.scratch), log=str(self.log),
                          cache_dir=str(self.home / "cache" / "builds"), memory_bytes=self.limits.memory_bytes,
                          file_bytes=self.limits.file_bytes, precompiled_headers=self.limits.precompiled_headers,
                          # The cache is read-only in the sandbox: builds it lacks are asked of this process (`call`).
                          server_builds=self.limits.sandbox,
                          # A profiler's front-end (ncu) and its target share a network (an abstract socket): the
                          # sandbox around both isolates it, or nothing does (the sandbox off).
                          isolate_network=self.limits.isolate_network and not self._prefix)
        await self._send(init.model_dump(mode="json"))
        timeout_s = _READY_TIMEOUT_S * (2 if self._prefix else 1)
        shared = None
        if self._prefix and self.limits.sandbox:  # the shared sandbox's report comes first (`_command`)
            first, fds = await self._receive(stage="start", timeout_s=timeout_s)
            close_all(fds)
            shared = first.get("sandbox") if isinstance(first.get("sandbox"), dict) else {
                "applied": [], "missing": ["sandbox: the profiler's sandbox sent no report"], "network": "unknown"}
        reply, fds = await self._receive(stage="start", timeout_s=timeout_s)
        close_all(fds)
        if "fatal" in reply:
            await self.aclose()
            raise HarnessError(f"{reply['fatal']}\n{reply.get('traceback', '')}")
        self.network = reply.get("network", "host")
        self.isolation = reply.get("isolation") or self.isolation
        if shared is not None:  # what holds is the shared sandbox's, and the Landlock the worker applied itself
            self.network = str(shared.get("network", "unknown"))
            self.isolation = {"applied": list(shared.get("applied", [])) + list(self.isolation.get("applied", [])),
                              "missing": list(shared.get("missing", [])) + list(self.isolation.get("missing", []))}
        if self._prefix:
            self._worker_pid = self._profiled_worker()
        self._trace("start", started)
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.aclose()

    async def call(self, request: Request[R], *, stage: str, timeout_s: float | None = None, timeout_why: str = "",
                   watch_background: bool = True) -> R:
        """Run one op in the worker and return its reply, validated as the op's reply model.

        `watch_background`: after a reply that carries the worker's integrity report, the server looks for work
        left running (`background_seen`, 40 ms); False where the caller looks once itself after several ops.

        Raises:
            WorkerDied: the worker timed out, crashed or exited; its group has been killed.
            HarnessError: KForge's own worker code raised (an unknown op, a request it could not validate).
            ProtocolViolation: the reply does not fit the op's reply model.
        """
        op = request.op  # type: ignore[attr-defined]
        # A fresh secret per call: a line the candidate wrote to the protocol's descriptors cannot carry it.
        nonce = secrets.token_hex(16)
        started = time.perf_counter()
        payload = {**request.model_dump(mode="json"), "nonce": nonce}
        await self._send(*HANDED.hand_out(payload))  # another worker's outputs: descriptors
        deadline = time.monotonic() + (timeout_s or self.limits.timeout_s)
        reply, fds = await self._receive(stage=stage, timeout_s=timeout_s or self.limits.timeout_s, why=timeout_why)
        while "build_request" in reply and reply.get("nonce") == nonce and set(reply) <= {"build_request", "nonce"}:
            # A build the read-only cache lacks, mid-op: built and promoted here (`build_service.serve_build_request`).

            close_all(fds)
            built = await serve_build_request(self.home, self.limits, self.scratch, reply["build_request"],
                                              deadline - time.monotonic())
            await self._send({"build_result": built})
            reply, fds = await self._receive(stage=stage, timeout_s=max(1.0, deadline - time.monotonic()), why=timeout_why)
        peaks = reply.pop("device_peak_bytes", None)
        parts = reply.pop("trace_parts", None) or {}  # where a slow op's time went
        reply.pop("ok", None)
        self._trace(op, started, peaks)
        if reply.pop("nonce", None) != nonce:
            close_all(fds)
            await self.kill()
            raise WorkerDied(Failure(
                stage=stage, kind="tampering",
                message="the worker's reply did not carry this call's secret: the candidate wrote to the harness's "
                        "result channel; the worker was killed and nothing it sent is trusted",
                output_tail=_tail(self.log)))
        self._handed += HANDED.take_in(reply, fds)
        for part, seconds in parts.items():
            trace(self.role, f"{op}/{part}", self.warm, started, seconds=seconds, to=self.limits.trace_file)
        if peaks:  # only from a reply that carried the secret: the pool waits on it (`WorkerPool.reaped`)
            self.device_bytes = max(self.device_bytes, peaks[0])
        if "fatal" in reply:
            raise HarnessError(f"worker op {op!r} failed: {reply['fatal']}\n{reply.get('traceback', '')}")
        try:
            answer = parse_reply(request, reply)
        except ProtocolError as exc:
            raise ProtocolViolation(str(exc)) from None
        if watch_background and isinstance(integrity := getattr(answer, "integrity", None), dict):
            integrity["background"] = list(integrity.get("background", [])) + await self.background_seen()
        if isinstance(answer, LoadReply):
            for pch_dir, build_dir in answer.pch_builds:  # only from a reply that carried the secret
                spawn_pch_build(self.home, self.limits, Path(pch_dir), Path(build_dir))
            self._mark_cache_hits(answer)
        return answer

    def _mark_cache_hits(self, reply: LoadReply) -> None:
        """The builds a load found in the shared cache, marked used by this process from what the worker mapped
        (`disk.mark_loaded`): the cache is read-only in the worker, so its hits cannot mark themselves."""
        if self._proc is not None and any(b.from_cache for b in reply.builds):
            pid = self._worker_pid or sandboxed_worker(self._proc.pid) or self._proc.pid  # (ncu maps no build)
            mark_loaded(pid, self.home / "cache" / "builds")

    async def background_seen(self) -> list[str]:
        """What the worker says it left running is checked inside its process; this is the server's own look:
        processes left in its namespace, and threads that kept running once it had answered. Not under a profiler:
        ncu and its launcher share the namespace, and its run decides nothing of the verdict."""
        if self._proc is None or self._prefix or "PID namespace" not in self.isolation.get("applied", []):
            return []
        return namespace_processes(self._proc.pid) + await busy_threads(self._proc.pid)

    async def _send(self, payload: dict[str, Any], fds: list[int] | None = None) -> None:
        assert self._channel is not None
        try:
            await self._channel.send((json.dumps(payload) + "\n").encode(), fds)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, BrokenPipeError):
            raise WorkerDied(await self._death(str(payload.get("op", "start")))) from None
        finally:
            close_all(fds or [])  # handed on (the receiver holds its own), or the receiver is gone

    async def _receive(self, *, stage: str, timeout_s: float, why: str = "") -> tuple[dict[str, Any], list[int]]:
        """The next reply and the descriptors that came with it."""
        assert self._channel is not None
        try:
            with anyio.fail_after(timeout_s):
                line, fds = await self._channel.receive_line(256 * 1024 * 1024)
        except TimeoutError:
            await self.kill()
            raise WorkerDied(Failure(
                stage=stage, kind="timeout",
                message=f"no answer within {timeout_s:.3g} s{why}; the worker and all its processes were killed "
                        "(an endless loop, a deadlock, or work too large for the time limit)",
                output_tail=_tail(self.log))) from None
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
            raise WorkerDied(await self._death(stage)) from None
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        return (reply, fds) if isinstance(reply, dict) else ({"garbled": True}, fds)

    async def _death(self, stage: str) -> Failure:
        assert self._proc is not None
        with anyio.move_on_after(5):
            await self._proc.wait()
        code = self._proc.returncode
        await self.kill()
        kind, message = _describe_exit(code if code is not None else -signal.SIGKILL)
        return Failure(stage=stage, kind=kind, message=message, output_tail=_tail(self.log))

    @property
    def under_profiler(self) -> bool:
        return bool(self._prefix)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def _members(self) -> set[int]:
        """Its process, and every process of its session or PID namespace (one may have left its group)."""
        assert self._proc is not None
        return {self._proc.pid, *session_members(self._proc.pid), *namespace_pids(self._proc.pid)}

    def pause(self, stopped: bool) -> None:
        """Stop (SIGSTOP) or resume every process of the worker's session: a candidate kept between jobs runs nothing."""
        if self._proc is None:
            return
        sig = signal.SIGSTOP if stopped else signal.SIGCONT
        sends = [(os.killpg, self._proc.pid)] + [(os.kill, pid) for pid in self._members()]
        for send, pid in sends:  # its group, and any process of its session or PID namespace that left the group
            try:
                send(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    async def stopped(self, within_s: float = 1.0) -> bool:
        """Whether every process of it shows stopped (`pause(True)`: a signal takes effect once its target is next
        scheduled), waiting up to `within_s`."""
        if self._proc is None:
            return False
        with anyio.move_on_after(within_s):
            while True:
                states = [st[1] for pid in self._members() if (st := process_stat(pid)) is not None]
                if states and all(state in "TtZX" for state in states):
                    return True
                await anyio.sleep(0.005)
        return False

    def leave_job(self) -> None:
        """Kept past its job (given back to the pool): the job's link to its directory goes, so that removing
        the job's scratch leaves the directory, still the worker's own."""
        if self.job_link is not None:
            try:
                self.job_link.unlink()
            except OSError:
                pass
            self.job_link = None

    def preemptions(self) -> Preemption | None:
        """How often and how long the worker's threads were kept off a core so far, read by the server."""
        return preemptions(self._proc.pid) if self._proc is not None else None

    async def kill(self) -> None:
        if self._proc is not None:
            await kill_group(self._proc)

    def kill_now(self) -> None:
        """SIGKILL the worker's session without waiting; `aclose` still waits for it. Not for a worker under a
        profiler, which writes its report as it exits."""
        if self._proc is not None and not self._prefix and self._proc.returncode is None:
            killpg(self._proc.pid)

    async def aclose(self) -> None:
        if self._proc is None:
            return
        started = time.perf_counter()
        HANDED.discard(self._handed)
        self._handed = []
        if self._proc.returncode is None and self._channel is not None:
            try:
                await self._channel.send_eof()  # EOF: the worker's loop ends on its own
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass
            # A profiler (ncu) writes its report after the worker exits: give it time before the kill.
            # A plain worker holds nothing worth a clean exit (replies are sent, logs flushed per op),
            # and tearing down torch takes about a second: kill its group at once.
            if self._prefix:
                with anyio.move_on_after(120):
                    await self._proc.wait()
        await self.kill()
        if self._channel is not None:
            await self._channel.aclose()
        await self._proc.aclose()
        self._proc = None
        self._trace("close", started)
