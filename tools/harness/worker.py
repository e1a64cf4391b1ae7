"""The isolated worker process: `python -m kforge.tools.harness.worker`.

Candidate and reference code run only here. The parent (`kforge.tools.process.runner`) sends one JSON
object per line on our protocol socket (fd 0 of a cold worker) and reads one JSON object per line back,
file descriptors passed beside them (`kforge.tools.process.channel`). Before any user code runs
the worker moves the protocol to private file descriptors and points fds 0/1/2 at /dev/null and a
log file, so nothing a candidate prints (from Python or C) can reach the protocol or the server's
stdio. A worker plays one role per job, named in its init (`ROLES`): the *judge* (`judge.Judge`) loads the reference,
makes the inputs and keeps the expected outputs in its own memory; the *candidate* worker (`candidate.Candidate`)
gets inputs only; a *host* worker answers the server's own questions (probe, ceilings). Requests and replies are
the models of `kforge.tools.process.protocol`, one pair per op, dispatched by the op's name to the role's handler.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import resource
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from kforge.backends.build.fast_build import job_cache_env

from ..process import protocol as p
from ..process.channel import WorkerChannel, close_all
from ..process.triton_seed import copy_into
from .handoff import return_free_memory
from .session import Session

__all__ = ["main"]


_MAX_FILES = 4096  # open file descriptors per worker (RLIMIT_NOFILE): torch, a build and the harness need far fewer
_KEPT_CACHE_BYTES = 256 * 2**20  # free device memory a worker may keep cached between ops (small problems reuse it)

def _set_limits(memory_bytes: int | None, file_bytes: int | None) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing candidate must not fill the disk
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # descriptors: bounded per worker, the limit named when hit
    wanted = _MAX_FILES if hard == resource.RLIM_INFINITY else min(hard, _MAX_FILES)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if file_bytes:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))


_CLONE_NEWNET, _CLONE_NEWUSER = 0x40000000, 0x10000000


def _isolate_network() -> str:
    """Move this process into a network namespace of its own (only a loopback that is down).

    Root (or CAP_SYS_ADMIN) can do it directly; other users through an unprivileged user namespace
    that maps their own ids. Must run while the process has a single thread (before torch).
    Returns "isolated", or why the worker stays on the host's network.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) == 0:
        return "isolated"
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return f"host (the OS refused a network namespace: {os.strerror(ctypes.get_errno())})"
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError as exc:  # still isolated, but files would look unowned: say so in the log
        print(f"kforge worker: user namespace id maps not written: {exc}", file=sys.stderr)
    return "isolated"


class Host:
    """The role of a worker that serves the server itself, never a job's code: which backends run here (`probe`,
    without a backend: it works where torch cannot be imported) and the device's measured ceilings."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def handlers(self) -> dict[type[p.Request[Any]], Callable[[Any], p.OpReply]]:
        return {p.ProbeRequest: self.probe, p.CeilingsRequest: self.ceilings}

    def probe(self, req: p.ProbeRequest) -> p.ProbeReply:
        from kforge.backends import load_backend
        from kforge.backends.base import Availability

        out = []
        for name in req.backends:
            try:
                out.append(load_backend(name).probe())
            except Exception as exc:  # noqa: BLE001 - a broken backend module is "unavailable"
                out.append(Availability(backend=name, ok=False, reason=f"backend failed to load: {exc}"))
        return p.ProbeReply(backends=out)

    def ceilings(self, req: p.CeilingsRequest) -> p.CeilingsReply:
        """The device's facts with its measured ceilings, measured once per device and cached (per GPU where the
        server names one: `gpu`, its uuid, on a multi-GPU host)."""
        import torch

        from ..gpus import ceilings_name

        backend = self.session.backend
        facts = backend.facts()
        path = self.session.cache_dir.parent / "ceilings" / ceilings_name(backend.name, facts.device_name,
                                                                         torch.__version__, req.gpu)
        if path.exists() and not req.remeasure:
            ceilings = json.loads(path.read_text())
        else:
            ceilings = backend.measure_ceilings()
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(ceilings))
            except OSError:  # the cache is read-only in the sandbox: the server stores what its own worker measured
                return p.CeilingsReply(facts=facts.model_copy(update=ceilings), cached=None,
                                       to_store={"name": path.name, "ceilings": ceilings})
        return p.CeilingsReply(facts=facts.model_copy(update=ceilings), cached=str(path))


# Each role's class, as "module:class" of this package: the judge holds the reference and the expected outputs, the
# candidate's worker (also under a rerun profiler: "rerun", e.g. Nsight Compute) runs ModelNew, and a host worker
# (`Host`, here) answers the server's own questions. The judge's and the candidate's modules import torch at the top
# like any torch code, so they are imported only for their role, once the job's backend is set up: this module must
# stay importable before torch (a worker enters its sandbox and network namespace while it has one thread, the fork
# server sets its backend's guard before torch starts, and a probe works where torch cannot be imported).
ROLES: dict[str, str | None] = {"judge": "judge:Judge", "candidate": "candidate:Candidate",
                                "rerun": "candidate:Candidate", "probe": None, "ceilings": None}  # None: `Host`


def role_class(role: str) -> Callable[[Session], Any]:
    """The class that plays `role` (`ROLES`)."""
    where = ROLES[role]
    if where is None:
        return Host
    module, name = where.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def open_session(init: p.WorkerInit, ready_backend: Any = None) -> Session:
    """The job's backend (a warm worker's, set up before it had a job, or loaded now), the limits set before any
    user code runs, and the harness's snapshot taken."""
    from kforge.backends import load_backend

    # A probe worker has no backend: it must work even where torch cannot be imported. A warm
    # worker (`ready_backend`) imported torch and set its backend up before it had a job.
    warm = ready_backend is not None and ready_backend.name == init.backend
    backend = ready_backend if warm else load_backend(init.backend) if init.backend else None
    memory = init.memory_bytes if getattr(backend, "limits_address_space", False) else None
    _set_limits(memory, init.file_bytes)  # before any user code runs
    session = Session(backend=backend, scratch=Path(init.scratch), cache_dir=Path(init.cache_dir),
                      precompiled_headers=init.precompiled_headers, server_builds=init.server_builds)
    if backend is not None:
        if not warm:
            backend.setup()
        from .integrity import HarnessSnapshot

        session.snapshot = HarnessSnapshot(backend)  # before user code: what the candidate must leave alone
    return session


def dispatch_table(role: Any) -> dict[str, Callable[[Any], p.OpReply]]:
    """op name -> the role's handler, from the protocol's request models."""
    return {request.model_fields["op"].default: handler for request, handler in role.handlers().items()}


def handle(table: dict[str, Callable[[Any], p.OpReply]], role_name: str, msg: dict[str, Any]) -> p.OpReply:
    """Validate `msg` (its envelope taken off) against the protocol and run its op; a ProtocolError says why not."""
    request = p.parse_request(msg)
    handler = table.get(request.op)  # type: ignore[attr-defined]
    if handler is None:
        raise p.ProtocolError(f"worker op {request.op!r} is not served by a {role_name} worker; "  # type: ignore[attr-defined]
                              f"its ops: {', '.join(sorted(table))}")
    return handler(request)


def _output_to(path: str | None) -> None:
    """Point fds 1 and 2 (and sys.stdout/err) at the job's log, or at /dev/null while there is no job."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


class _Phases(dict):
    """Seconds per named phase, for the pool's trace (`pool.zygote`, `pool.fork`): where a start's time goes."""

    def __init__(self) -> None:
        super().__init__()
        self._at = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self[name], self._at = round(now - self._at, 3), now


def _preload(backend_name: str) -> dict[str, float]:
    """What every job needs, paid once in the zygote: torch, the backend's module, the loader and the
    harness's ops, torch's extension module, and the compilers' identities (subprocesses) that build keys
    include. Nothing here may start the device: CUDA does not survive a fork. Returns its phases' seconds."""
    from kforge.backends import backend_class, import_backend_module

    phases = _Phases()
    import_backend_module(backend_name)
    phases.done("backend module")  # torch and what the backend imports (Triton and Inductor's code generation)
    import torch._dynamo  # noqa: F401 - ~1 s, pulled in by FlopCounterMode and torch.compile
    from torch.utils import cpp_extension, flop_counter  # noqa: F401

    from kforge.profilers import torch_profiler  # noqa: F401
    phases.done("dynamo, extensions, profiler")

    from . import candidate, compare, inputs, integrity, judge, output_contract, timing  # noqa: F401
    from .loader import load_user_module  # noqa: F401
    try:
        from . import compare_kernel  # noqa: F401 - the judge's compare on a GPU (Triton, where it is installed)
    except ImportError:
        pass
    phases.done("harness")

    backend = backend_class(backend_name)
    parts = backend.preload()  # the compilers' identities that its builds' keys include
    phases.done("compilers' identities")
    phases.update({f"compilers' identities: {name}": s for name, s in (parts or {}).items()})
    if backend.device_started_here():
        raise RuntimeError(f"the {backend_name} device was started while preloading; forked workers could not use it")
    return phases


def _warm_device(backend: Any) -> None:
    """First-use costs of the device, paid before the job: a launch and the profiler's start-up (CUPTI on
    a GPU takes seconds the first time in a process, and verify and profile both profile)."""
    import torch
    from torch.profiler import profile

    x = backend.to_device(torch.ones(256))
    with profile(activities=backend.profiler_activities()):
        (x + 1).sum()
        backend.synchronize()
    # The math libraries' handles and the timing loop's flush buffer and timers: a job's first GEMM paid
    # ~0.2 s for cuBLAS's start on an H100, once in the candidate's process and once in the judge's.
    m = x.view(16, 16)
    torch.nn.functional.linear(m, m, x[:16])
    backend.flush_cache()
    timer = backend.timer()
    timer.start()
    (m @ m).relu_()
    timer.stop()
    timer.elapsed_s()


def _warm_libraries(backend: Any) -> list[str]:
    """First uses that a job would otherwise pay inside its verify or profile, measured on an H100 after
    `_warm_device` (bench/explore/first_use.py): the judge's first output comparison 0.29-0.45 s (its kernels,
    float64 among them), and the device's math libraries (`Backend.warm_libraries`: on a GPU cuDNN's start 0.44 s,
    cuBLAS's bfloat16, float16 and float64 paths 0.14 s each). Paid here, before the job, on inputs of a size whose
    kernels the comparison also uses on large outputs; on a GPU that builds the fused compare's kernel
    (`compare_kernel`, ~1.1 s of Triton's on an H200, 2026-12-03), once per worker since Triton's cache is the job's
    own. Also the first trial's output digest: its own cost is not yet measured (first_use.py's `digest` step);
    warming it left the first check's 0.06-0.11 s on an H200 as it was."""
    import torch

    from .compare import compare_kernel_failures, compare_outputs
    from .output_contract import digest_weights, value_digest

    dev = backend.device
    expected = torch.randn(1 << 20, device=dev)
    got = expected + 1e-6
    for exact in ([expected.double()], None):
        compare_outputs([expected], [got], exact=exact, device=dev)
    value_digest(got, digest_weights(dev))  # the first trial's check digests its outputs (its own weights, later)
    backend.warm_libraries()
    # What went wrong short of failing the worker (the pool traces it with the fork): a fused compare that could
    # not build or run here, whose outputs the torch passes compare instead.
    return [f"fused output compare failed, torch compares instead: {why}" for why in compare_kernel_failures()]


def _forked_worker(backend_name: str, network: str, confinement: Any,
                   guard: dict[str, str]) -> Callable[[socket.socket], None]:
    """The body of a worker forked by the zygote: its sandbox, its kind's environment (without the zygote's `guard`,
    `_fork_server_env`), the device, then one job."""
    def run(sock: socket.socket) -> None:
        from kforge.backends import load_backend

        sys.dont_write_bytecode = True  # the zygote may write the byte-code cache; a worker never does
        channel = WorkerChannel(sock)
        first = _read(channel)
        if first is None:
            return  # the pool shut down before this worker was readied
        # Its own directory, made for it by the pool: the only one of the data directory's jobs/ it may write.
        own = (first["scratch"],) if first.get("scratch") else ()
        for name in guard:  # the zygote's guard; a job sees what a cold worker sees
            os.environ.pop(name, None)
        os.environ.update(first.get("env") or {})  # before the device starts: CUDA reads it once
        phases = _Phases()
        isolation = _isolation(confinement and replace(confinement, extra_writable=own), network,  # one thread
                               backend_name)
        if first.get("scratch"):  # the zygote's own directory lies in the cache, read-only here
            use_own_directories(first["scratch"])
        # What earlier forks compiled while they readied (the fused compare): a cache hit here (`triton_seed`).
        copy_into(first.get("triton_seed"), os.environ.get("TRITON_CACHE_DIR"))
        phases.done("sandbox")
        try:
            backend = load_backend(backend_name)
            backend.setup()
            phases.done("setup")
            _warm_device(backend)
            phases.done("device")  # its start (a GPU's context), a launch and the profiler's first start
            notes = _warm_libraries(backend)
            phases.done("libraries")
        except BaseException as exc:  # noqa: BLE001 - the pool stops; a cold worker will report the problem
            channel.write({"warm": False, "why": f"{type(exc).__name__}: {exc}"[:500]})
            return
        channel.write({"warm": True, "pid": isolation["host_pid"], "phases": phases, "notes": notes})
        _serve(channel, backend, isolation)

    return run


def use_own_directories(scratch: str) -> None:
    """A forked worker's temporary files and caches in its own directory (`job_cache_env`). Python reads TMPDIR once
    and keeps it (`tempfile.tempdir`), and a fork inherits the fork server's (its directory in the read-only cache, once
    the Triton driver's build asked for it there): Triton's PTX files for ptxas failed with "Read-only file system" in
    every warm GPU worker (H200, 2026-12-03), so it is read again."""
    os.environ.update(job_cache_env(scratch))
    tempfile.tempdir = None


def _fork_server_env(backend_name: str) -> dict[str, str]:
    """What the fork server sets while it imports so that nothing starts the device (`Backend.fork_server_env`)."""
    from kforge.backends import backend_class, import_backend_module

    import_backend_module(backend_name)
    return dict(backend_class(backend_name).fork_server_env)


def main() -> None:
    # No signal blocked, whatever the parent blocked: a Ray actor blocks SIGINT, and its mask, inherited by every
    # process below it, kept `perf stat` from ever seeing the SIGINT that stops it (each profile on a Ray node
    # waited 10 s for it, then lost its counters; 2-core VM, 2026-11-28).
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    # Keep the protocol on private fds; user code gets /dev/null for stdin and a log file for 1/2.
    first_fd = os.dup(0)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    if "--zygote" in sys.argv:  # the pool's fork server: fd 0 was its control socket
        from .forkserver import serve_forks

        _output_to(None)
        backend_name = sys.argv[sys.argv.index("--zygote") + 1]
        network = "host"
        if "--isolate-network" in sys.argv and sys.platform == "linux":
            network = _isolate_network()  # while single-threaded, before torch; the workers inherit it
        # The server's byte-code cache (`kforge.tools.process.bytecode`): the fork server, which runs KForge's code
        # only, adds what it imports; its workers find the cache read-only and write nothing (`_forked_worker`).
        sys.dont_write_bytecode = "PYTHONPYCACHEPREFIX" not in os.environ
        guard = _fork_server_env(backend_name)
        os.environ.update(guard)  # before anything imports torch
        serve_forks(first_fd, lambda: _preload(backend_name),
                    _forked_worker(backend_name, network, _confinement(), guard))
        return
    channel = WorkerChannel(socket.socket(fileno=first_fd))
    init = _read(channel)  # before the sandbox: the job's backend (and its GPU pin) pick the device nodes it may open
    if init is None:
        return
    if "--landlock" in sys.argv:  # under ncu, in the sandbox it shares with ncu's front-end: Landlock is its own
        isolation = _landlock_here(_confinement("--landlock"), init.get("backend"))
    else:
        isolation = _isolation(_confinement(), "host", init.get("backend"))  # before torch: still one thread
    _serve(channel, None, isolation, init)


def _confinement(flag: str = "--sandbox") -> Any:
    """The sandbox the server asked for (`--sandbox <json>`; `--landlock <json>`: only its Landlock), or None."""
    if flag not in sys.argv:
        return None
    from ..process.sandbox import Confinement

    return Confinement.from_arg(sys.argv[sys.argv.index(flag) + 1])


def _landlock_here(confinement: Any, backend: str | None) -> dict[str, Any]:
    """Landlock alone (`sandbox.apply_landlock`), for a worker profiled by ncu: the rest of the sandbox it shares
    with ncu's front-end was entered before ncu started, and reported by it (`kforge.tools.process.profiled_launch`)."""
    from ..process.sandbox import apply_landlock, with_gpu_nodes

    confinement, why = with_gpu_nodes(confinement, backend)
    # Landlock binds the calling thread and the threads it starts: ncu's injection starts one in the worker before
    # Python's main (H100, 2026-11-25), which this domain cannot reach. The profiler's launcher put ncu and this
    # whole process in a domain of its own before (`profiled_launch`, which says so in the environment); without it
    # those threads are outside Landlock, and the report says so.
    from ..process.profiled_launch import PROFILER_LANDLOCK_ENV

    try:
        others = len(os.listdir("/proc/self/task")) - 1
    except OSError:
        others = 0
    report = apply_landlock(confinement)
    if others > 0 and os.environ.get(PROFILER_LANDLOCK_ENV) == "1":
        report["applied"].append(f"{others} earlier thread(s) (ncu's injection) under the profiler's Landlock")
    elif others > 0:
        report["missing"].append(f"landlock: {others} thread(s) already running in the profiled worker (ncu's "
                                 "injection) are outside it")
    return {"host_pid": os.getpid(), "applied": report["applied"], "missing": report["missing"] + ([why] if why else []),
            "network": "shared with its profiler"}


def _isolation(confinement: Any, network: str, backend: str | None = None) -> dict[str, Any]:
    """Enter the sandbox (`kforge.tools.process.sandbox`) where one was asked for; what holds, and what is missing. The
    device nodes it may open follow from the worker's backend and its environment's pin to a device
    (`Backend.device_nodes`), known only here (a cold worker's from its first message, a forked one's from the
    pool's), unless the server chose."""
    if confinement is None:
        return {"host_pid": os.getpid(), "applied": [], "missing": ["sandbox: not asked for (KFORGE_WORKER_SANDBOX=0)"],
                "network": network}
    from ..process.sandbox import enter, network_state, with_gpu_nodes

    confinement, why = with_gpu_nodes(confinement, backend)
    report = enter(confinement)
    report["missing"] += [why] if why else []
    report["network"] = network_state(report, network)
    return report


def _device_memory_around_op(backend: Any) -> Callable[[], dict[str, Any]]:
    """Called before an op; what it returns is called after it: cached device memory beyond
    `_KEPT_CACHE_BYTES` goes back to the device (between ops the other worker of the job runs, and on a
    several-GB problem it needs that room: blocks cached by one process are invisible to the other), and
    the op's peaks of reserved and allocated device memory, for KFORGE_TRACE (never for a verdict)."""
    try:
        if backend is None or not backend.reset_memory_peaks():  # no device memory, or not started
            return dict
    except Exception:  # noqa: BLE001 - a device the candidate's fault left unusable: the op reports that
        return dict

    def after() -> dict[str, Any]:
        try:
            peaks = backend.memory_peaks()
            return_free_memory(backend, _KEPT_CACHE_BYTES)
        except Exception:  # noqa: BLE001
            return {}
        return {"device_peak_bytes": peaks}

    return after


def _read(channel: WorkerChannel) -> dict[str, Any] | None:
    """The next message, the descriptors that came with it as its "fds"; None at EOF."""
    got = channel.readline()
    if got is None:
        return None
    line, fds = got
    msg = json.loads(line)
    msg["fds"] = fds
    return msg


def _serve(channel: WorkerChannel, warm_backend: Any, isolation: dict[str, Any],
           init_msg: dict[str, Any] | None = None) -> None:
    """Take the job's init (unless it was read already), start the role's object, then answer ops until the parent
    closes the channel."""
    init_msg = init_msg if init_msg is not None else _read(channel)
    if init_msg is None:
        return  # the pool shut down before this worker got a job

    def reply(payload: dict[str, Any], fds: list[int] | None = None) -> None:
        channel.write(payload, fds)
        close_all(fds or [])  # sent: the receiver has its own; the shelf's mapping keeps the memory

    close_all(init_msg.pop("fds"))
    try:
        init = p.WorkerInit.model_validate(init_msg)
    except ValueError as exc:
        reply({"fatal": f"worker could not start: its init message does not validate: {exc}"})
        return
    _output_to(init.log)
    os.chdir(init.scratch)
    os.environ.update(job_cache_env(init.scratch))  # TMPDIR and the per-job caches (torch.compile, Triton)
    tempfile.tempdir = None  # a warm worker may have cached the pool's directory
    if warm_backend is None and init.isolate_network and sys.platform == "linux" and (
            isolation["network"] != "isolated"):
        isolation["network"] = _isolate_network()
    try:
        if init.role not in ROLES:
            raise ValueError(f"unknown worker role {init.role!r}; known: {', '.join(sorted(ROLES))}")
        session = open_session(init, warm_backend)
        role = role_class(init.role)(session)
    except BaseException as exc:  # noqa: BLE001
        reply({"fatal": f"worker could not start: {type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return
    session.channel, session.read_message = channel, _read
    table = dispatch_table(role)
    reply({"ready": True, "pid": isolation["host_pid"], "network": isolation["network"],
           "isolation": {"applied": isolation["applied"], "missing": isolation["missing"]}})
    while (msg := _read(channel)) is not None:
        session.nonce, session.received_fds = msg.pop("nonce", None), msg.pop("fds")
        session.trace_parts = {}
        try:
            after_op = _device_memory_around_op(session.backend)
            answer = handle(table, init.role, msg)
            envelope = {"ok": True, **after_op(), "nonce": session.nonce}
            if session.trace_parts:
                envelope["trace_parts"] = session.trace_parts
            reply({**answer.model_dump(mode="json"), **envelope}, session.shelf.take_outgoing())
        except p.ProtocolError as exc:  # an op this worker does not know, or a request that does not validate
            reply({"fatal": str(exc), "nonce": session.nonce})
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                reply({"fatal": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(), "nonce": session.nonce})
                continue
            # The harness could not open a file because the candidate holds every descriptor: its failure.
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            reply({"failure": {"stage": str(msg.get("op")), "kind": "resource_limit",
                               "message": f"the process ran out of file descriptors (the limit is {limit}, RLIMIT_NOFILE): "
                                          "the candidate opened files, sockets or pipes and did not close them"},
                   "nonce": session.nonce})
        except Exception as exc:  # noqa: BLE001 - a harness bug; report it rather than hang the parent
            reply({"fatal": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(), "nonce": session.nonce})
        finally:
            close_all(session.received_fds)  # what came with the request is mapped by now, or not needed
            close_all(session.shelf.take_outgoing())  # described for a reply that was not sent
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    main()
