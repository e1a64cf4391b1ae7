"""The isolated worker process: `python -m kforge.tools.harness.worker`.

Candidate and reference code run only here. The parent (`kforge.tools.process.runner`) sends one JSON
object per line on our protocol socket (fd 0 of a cold worker) and reads one JSON object per line back,
file descriptors passed beside them (`kforge.tools.process.channel`). Before any user code runs
the worker moves the protocol to private file descriptors and points fds 0/1/2 at /dev/null and a
log file, so nothing a candidate prints (from Python or C) can reach the protocol or the server's
stdio. A worker plays one role per job: the *judge* loads the reference, makes the inputs and keeps
the expected outputs in its own memory; the *candidate* worker gets inputs only.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import socket
import sys
import tempfile
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .candidate_ops import CandidateOps
from ..process.channel import WorkerChannel, close_all
from kforge.backends.build.fast_build import job_cache_env
from .handoff import return_free_memory
from .judge import JudgeOps

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


class Worker(JudgeOps, CandidateOps):
    def __init__(self, init: dict[str, Any], ready_backend: Any = None) -> None:
        from kforge.backends import load_backend

        self.scratch = Path(init["scratch"])
        self.cache_dir = Path(init["cache_dir"])
        self.precompiled_headers = bool(init.get("precompiled_headers"))
        self.server_builds = bool(init.get("server_builds"))  # the shared cache is read-only: the server builds
        self.channel: Any = None  # set by `_serve`: a build request goes to the server mid-op
        # A probe worker has no backend: it must work even where torch cannot be imported. A warm
        # worker (`ready_backend`) imported torch and set its backend up before it had a job.
        warm = ready_backend is not None and ready_backend.name == init.get("backend")
        self.backend = ready_backend if warm else load_backend(init["backend"]) if init.get("backend") else None
        memory = init.get("memory_bytes") if getattr(self.backend, "limits_address_space", False) else None
        _set_limits(memory, init.get("file_bytes"))  # before any user code runs
        if self.backend is not None:
            if not warm:
                self.backend.setup()
            from .integrity import HarnessSnapshot

            self.snapshot = HarnessSnapshot()  # before user code: what the candidate must leave alone
        self.module: Any = None
        self.user_file: Path | None = None
        self.extensions: list[Any] = []
        self.kernel_names: list[str] = []
        self.model: Any = None
        self.sets: list[list[Any]] = []
        self.expected: list[list[Any]] = []
        self.expected_devices: list[str | None] = []
        self.exact: list[list[Any]] = []
        self.distributions: list[str] = []
        self.timing_sets: list[list[Any]] = []
        self.copy_timing_inputs = True
        self.series: dict[str, dict[str, Any]] = {}  # per timed series: replay schedule, kept outputs
        self.compiled: Any = None
        from .handoff import OutputShelf

        self.shelf = OutputShelf()  # outputs the judge reads in place (candidate role)
        self.expected_index: int | None = None
        self._reference_inputs: Any = None
        self._output_sizes: list[int] = []  # the last trial's output bytes: what `op_repeat` poisons
        self._first_digests: list[Any] = []  # the judge's digests of a trial's first outputs (`op_check_repeat`)
        self._weights: Any = None  # ... and their secret weights, drawn once

    # -- helpers ---------------------------------------------------------------------------------
    def _args(self, i: int, sets: list[list[Any]] | None = None) -> list[Any]:
        """Fresh device copies of input set i (of `sets`, default the trial sets)."""
        import torch

        sets = sets or self.sets
        raw = sets[i % len(sets)]
        return self.backend.to_device([a.clone() if isinstance(a, torch.Tensor) else a for a in raw])

    def _inputs_module(self, reference_source: str | None) -> Any:
        """The module whose `get_inputs()` makes the problem's inputs: the judge's own reference, or in the
        candidate's process the reference's source loaded beside the candidate (inputs only: the expected
        outputs stay in the judge)."""
        if reference_source is None:
            return self.module
        if self._reference_inputs is None:
            from .loader import load_user_module

            outcome = load_user_module(reference_source, path=self.scratch / "reference_inputs.py",
                                       module_name="kforge_reference_inputs", cache_dir=self.cache_dir,
                                       backend=self.backend, precompiled_headers=False)
            if outcome.failure is not None:
                raise RuntimeError(f"the reference's get_inputs could not be loaded: {outcome.failure.message}")
            self._reference_inputs = outcome.module
        return self._reference_inputs

    def _failure(self, exc: BaseException, stage: str) -> dict[str, Any]:
        from .loader import python_failure

        f = python_failure(exc, stage=stage, user_file=self.user_file or Path("<none>"))
        return {"failure": f.model_dump(mode="json")}

    # -- ops -------------------------------------------------------------------------------------
    def op_probe(self, msg: dict[str, Any]) -> dict[str, Any]:
        from kforge.backends import load_backend

        out = []
        for name in msg["backends"]:
            try:
                out.append(load_backend(name).probe().model_dump(mode="json"))
            except Exception as exc:  # noqa: BLE001 - a broken backend module is "unavailable"
                out.append({"backend": name, "ok": False, "reason": f"backend failed to load: {exc}"})
        return {"backends": out}

    def op_ceilings(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The device's facts with its measured ceilings, measured once per device and cached (per GPU where the
        server names one: `gpu`, its uuid, on a multi-GPU host)."""
        import torch

        from ..gpus import ceilings_name

        facts = self.backend.facts()
        path = self.cache_dir.parent / "ceilings" / ceilings_name(self.backend.name, facts.device_name,
                                                                  torch.__version__, msg.get("gpu"))
        if path.exists() and not msg.get("remeasure"):
            ceilings = json.loads(path.read_text())
        else:
            ceilings = self.backend.measure_ceilings()
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(ceilings))
            except OSError:  # the cache is read-only in the sandbox: the server stores what its own worker measured
                return {"facts": facts.model_copy(update=ceilings).model_dump(mode="json"), "cached": None,
                        "to_store": {"name": path.name, "ceilings": ceilings}}
        return {"facts": facts.model_copy(update=ceilings).model_dump(mode="json"), "cached": str(path)}

    def op_load(self, msg: dict[str, Any]) -> dict[str, Any]:
        from .loader import load_user_module

        role = msg["role"]
        self.user_file = self.scratch / f"{role}.py"
        # The header builds it wants are started by the server, sandbox or not: they end with the server (issue 17),
        # where one started here would outlive it (without a PID namespace to die with, by up to 900 s).
        pch_requests: list[list[str]] = []
        build_request = None
        if self.server_builds and self.channel is not None:  # the cache is read-only here: the server builds
            def build_request(request: dict[str, Any]) -> dict[str, Any] | None:
                self.channel.write({"build_request": request, "nonce": msg.get("nonce")})
                answer = _read(self.channel)
                if answer is None:
                    raise SystemExit(0)  # the server is gone
                close_all(answer.pop("fds"))
                return answer.get("build_result")
        outcome = load_user_module(msg["source"], path=self.user_file, module_name=f"kforge_{role}",
                                   cache_dir=self.cache_dir, backend=self.backend,
                                   precompiled_headers=self.precompiled_headers, pch_requests=pch_requests,
                                   build_request=build_request)
        self.module, self.extensions = outcome.module, outcome.extensions
        self.kernel_names = [k.kernel for b in outcome.builds for k in b.kernels]
        if self.module is not None:  # Triton kernels are the candidate's own too (jit, autotuned, heuristics)
            self.kernel_names += [name for name, obj in vars(self.module).items()
                                  if type(obj).__module__.startswith("triton") and callable(obj)]
        failure = outcome.failure
        wanted = "Model" if role == "reference" else "ModelNew"
        if failure is None:
            failure = self._interface_failure(wanted, reference=(role == "reference"))
        return {"seconds": outcome.seconds, "builds": [b.model_dump(mode="json") for b in outcome.builds],
                "pch_builds": pch_requests,
                "kernel_names": self.kernel_names,
                "diagnostics": [d.model_dump(mode="json") for d in outcome.diagnostics],
                "failure": failure.model_dump(mode="json") if failure else None}

    def _interface_failure(self, wanted: str, *, reference: bool) -> Any:
        import torch

        from ..models import Failure

        missing = []
        cls = getattr(self.module, wanted, None)
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            missing.append(f"class {wanted}(torch.nn.Module)")
        if reference:
            missing += [f"function {f}()" for f in ("get_inputs", "get_init_inputs") if not callable(getattr(self.module, f, None))]
        if not missing:
            return None
        who = "reference" if reference else "candidate"
        return Failure(stage="load", kind="interface_error",
                       message=f"the {who} does not define {', '.join(missing)} (KernelBench format)")

    def op_read_ncu(self, msg: dict[str, Any]) -> dict[str, Any]:
        from kforge.profilers.ncu import read_report

        try:
            kernels = read_report(Path(msg["report"]), msg["custom_names"])
        except Exception as exc:  # noqa: BLE001 - a report we cannot read is a note, not a failed profile
            return {"kernels": [], "note": f"could not read the Nsight Compute report: {type(exc).__name__}: {exc}"}
        return {"kernels": [k.model_dump(mode="json") for k in kernels], "note": None}


def _output_to(path: str | None) -> None:
    """Point fds 1 and 2 (and sys.stdout/err) at the job's log, or at /dev/null while there is no job."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


def _preload(backend_name: str) -> None:
    """What every job needs, paid once in the zygote: torch, the backend's module, the loader and the
    harness's ops, torch's extension module, and the compilers' identities (subprocesses) that build keys
    include. Nothing here may start the device: CUDA does not survive a fork."""
    from kforge.backends import import_backend_module

    import_backend_module(backend_name)
    import torch._dynamo  # noqa: F401 - ~1 s, pulled in by FlopCounterMode and torch.compile
    from torch.utils import cpp_extension, flop_counter  # noqa: F401

    from kforge.profilers import torch_profiler  # noqa: F401

    from . import compare, inputs, integrity, output_contract, timing  # noqa: F401
    from kforge.backends.build.fast_build import toolchain_id
    from .loader import load_user_module  # noqa: F401

    toolchain_id(False)
    if backend_name == "cuda":
        toolchain_id(True)
    if _cuda_driver_started():
        raise RuntimeError("the CUDA driver was initialized while preloading; forked workers could not use the GPU")


def _cuda_driver_started() -> bool:
    """Has this process called cuInit? (cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED until then.)"""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False  # no driver, nothing to start
    count = ctypes.c_int(0)
    return lib.cuDeviceGetCount(ctypes.byref(count)) != 3


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


def _warm_libraries(backend: Any) -> None:
    """First uses that a job would otherwise pay inside its verify or profile, measured on an H100 after
    `_warm_device` (bench/explore/first_use.py): the judge's first output comparison 0.29-0.45 s (its kernels,
    float64 among them), cuDNN's start 0.44 s (any convolution), cuBLAS's bfloat16, float16 and float64 paths
    0.14 s each (the bfloat16 null candidate, the float64 exact outputs). Paid here, before the job, on
    inputs of a size whose kernels the comparison also uses on large outputs."""
    import torch

    from .compare import compare_outputs

    dev = backend.device
    expected = torch.randn(1 << 20, device=dev)
    got = expected + 1e-6
    for exact in ([expected.double()], None):
        compare_outputs([expected], [got], exact=exact, device=dev)
    if not dev.startswith("cuda"):
        return
    m = expected[: 256 * 256].view(256, 256)
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        torch.nn.functional.linear(m.to(dtype), m.to(dtype), m[0].to(dtype))
    x = expected[: 2 * 8 * 16 * 16].view(2, 8, 16, 16)
    torch.nn.functional.conv2d(x, x[:8, :8, :3, :3])
    backend.synchronize()


def _forked_worker(backend_name: str, network: str, confinement: Any) -> Callable[[socket.socket], None]:
    """The body of a worker forked by the zygote: its sandbox, its kind's environment, the device, then one job."""
    def run(sock: socket.socket) -> None:
        from kforge.backends import load_backend

        channel = WorkerChannel(sock)
        first = _read(channel)
        if first is None:
            return  # the pool shut down before this worker was readied
        # Its own directory, made for it by the pool: the only one of the data directory's jobs/ it may write.
        own = (first["scratch"],) if first.get("scratch") else ()
        visible = (first.get("env") or {}).get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
        isolation = _isolation(confinement and replace(confinement, extra_writable=own), network,  # one thread
                               backend_name, visible)
        os.environ.pop(_NVML_CHECK, None)  # the zygote's guard; a job sees what a cold worker sees
        os.environ.update(first.get("env") or {})  # before the device starts: CUDA reads it once
        if first.get("scratch"):  # the zygote's own directory lies in the cache, read-only here
            os.environ.update(job_cache_env(first["scratch"]))
        try:
            backend = load_backend(backend_name)
            backend.setup()
            _warm_device(backend)
            _warm_libraries(backend)
        except BaseException as exc:  # noqa: BLE001 - the pool stops; a cold worker will report the problem
            channel.write({"warm": False, "why": f"{type(exc).__name__}: {exc}"[:500]})
            return
        channel.write({"warm": True, "pid": isolation["host_pid"]})
        _serve(channel, backend, isolation)

    return run


# torch.cuda.is_available() through NVML, not the CUDA runtime: asking must not initialize CUDA in the zygote.
_NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def main() -> None:
    # Keep the protocol on private fds; user code gets /dev/null for stdin and a log file for 1/2.
    first_fd = os.dup(0)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    if "--zygote" in sys.argv:  # the pool's fork server: fd 0 was its control socket
        from .forkserver import serve_forks

        _output_to(None)
        os.environ[_NVML_CHECK] = "1"
        backend_name = sys.argv[sys.argv.index("--zygote") + 1]
        network = "host"
        if "--isolate-network" in sys.argv and sys.platform == "linux":
            network = _isolate_network()  # while single-threaded, before torch; the workers inherit it
        serve_forks(first_fd, lambda: _preload(backend_name), _forked_worker(backend_name, network, _confinement()))
        return
    channel = WorkerChannel(socket.socket(fileno=first_fd))
    init = _read(channel)  # before the sandbox: the job's backend (and its GPU pin) pick the device nodes it may open
    if init is None:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if "--landlock" in sys.argv:  # under ncu, in the sandbox it shares with ncu's front-end: Landlock is its own
        isolation = _landlock_here(_confinement("--landlock"), init.get("backend"), visible)
    else:
        isolation = _isolation(_confinement(), "host", init.get("backend"), visible)  # before torch: still one thread
    _serve(channel, None, isolation, init)


def _confinement(flag: str = "--sandbox") -> Any:
    """The sandbox the server asked for (`--sandbox <json>`; `--landlock <json>`: only its Landlock), or None."""
    if flag not in sys.argv:
        return None
    from ..process.sandbox import Confinement

    return Confinement.from_arg(sys.argv[sys.argv.index(flag) + 1])


def _landlock_here(confinement: Any, backend: str | None, visible: str | None) -> dict[str, Any]:
    """Landlock alone (`sandbox.apply_landlock`), for a worker profiled by ncu: the rest of the sandbox it shares
    with ncu's front-end was entered before ncu started, and reported by it (`kforge.profilers.ncu.main`)."""
    from ..process.sandbox import apply_landlock, with_gpu_nodes

    confinement, why = with_gpu_nodes(confinement, backend, visible)
    # Landlock binds the calling thread and the threads it starts: ncu's injection starts one in the worker before
    # Python's main (H100, 2026-11-25), which stays outside it. Said, not assumed. (An exec right after would end
    # that thread and keep the domain, so the new image's threads all start inside it; not yet run on a GPU.)
    try:
        others = len(os.listdir("/proc/self/task")) - 1
    except OSError:
        others = 0
    report = apply_landlock(confinement)
    if others > 0:
        report["missing"].append(f"landlock: {others} thread(s) already running in the profiled worker (ncu's "
                                 "injection) are outside it")
    return {"host_pid": os.getpid(), "applied": report["applied"], "missing": report["missing"] + ([why] if why else []),
            "network": "shared with its profiler"}


def _isolation(confinement: Any, network: str, backend: str | None = None, visible: str | None = None) -> dict[str, Any]:
    """Enter the sandbox (`kforge.tools.process.sandbox`) where one was asked for; what holds, and what is missing. The
    GPU device nodes it may open follow from the worker's backend and its CUDA_VISIBLE_DEVICES (`visible`), known
    only here (a cold worker's from its first message, a forked one's from the zygote's), unless the server chose."""
    if confinement is None:
        return {"host_pid": os.getpid(), "applied": [], "missing": ["sandbox: not asked for (KFORGE_WORKER_SANDBOX=0)"],
                "network": network}
    from ..process.sandbox import enter, network_state, with_gpu_nodes

    confinement, why = with_gpu_nodes(confinement, backend, visible)
    report = enter(confinement)
    report["missing"] += [why] if why else []
    report["network"] = network_state(report, network)
    return report


def _device_memory_around_op() -> Callable[[], dict[str, Any]]:
    """Called before an op; what it returns is called after it: cached device memory beyond
    `_KEPT_CACHE_BYTES` goes back to the GPU (between ops the other worker of the job runs, and on a
    several-GB problem it needs that room: blocks cached by one process are invisible to the other), and
    the op's peaks of reserved and allocated device memory, for KFORGE_TRACE (never for a verdict)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():  # (is_available() would start the driver)
        return dict
    try:
        torch.cuda.reset_peak_memory_stats()
    except Exception:  # noqa: BLE001 - a device the candidate's fault left unusable: the op reports that
        return dict

    def after() -> dict[str, Any]:
        try:
            peaks = [torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()]
            return_free_memory("cuda", _KEPT_CACHE_BYTES)
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
           init: dict[str, Any] | None = None) -> None:
    """Take the job's init (unless it was read already), start the Worker, then answer ops until the parent closes
    the channel."""
    init = init if init is not None else _read(channel)
    if init is None:
        return  # the pool shut down before this worker got a job
    _output_to(init["log"])
    os.chdir(init["scratch"])
    os.environ.update(job_cache_env(init["scratch"]))  # TMPDIR and the per-job caches (torch.compile, Triton)
    tempfile.tempdir = None  # a warm worker may have cached the pool's directory
    if warm_backend is None and init.get("isolate_network") and sys.platform == "linux" and (
            isolation["network"] != "isolated"):
        isolation["network"] = _isolate_network()

    def reply(payload: dict[str, Any], fds: list[int] | None = None) -> None:
        channel.write(payload, fds)
        close_all(fds or [])  # sent: the receiver has its own; the shelf's mapping keeps the memory

    try:
        worker = Worker(init, warm_backend)
    except BaseException as exc:  # noqa: BLE001
        reply({"fatal": f"worker could not start: {type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return
    worker.channel = channel
    reply({"ready": True, "pid": isolation["host_pid"], "network": isolation["network"],
           "isolation": {"applied": isolation["applied"], "missing": isolation["missing"]}})
    while (msg := _read(channel)) is not None:
        handler = getattr(worker, f"op_{msg['op']}", None)
        if handler is None:
            reply({"fatal": f"unknown op {msg['op']!r}", "nonce": msg.get("nonce")})
            close_all(msg["fds"])
            continue
        try:
            after_op = _device_memory_around_op()
            answer = handler(msg)
            reply({"ok": True, **answer, **after_op(), "nonce": msg.get("nonce")}, worker.shelf.take_outgoing())
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                reply({"fatal": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(), "nonce": msg.get("nonce")})
                continue
            # The harness could not open a file because the candidate holds every descriptor: its failure.
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            reply({"failure": {"stage": msg.get("stage") or msg["op"], "kind": "resource_limit",
                               "message": f"the process ran out of file descriptors (the limit is {limit}, RLIMIT_NOFILE): "
                                          "the candidate opened files, sockets or pipes and did not close them"},
                   "nonce": msg.get("nonce")})
        except Exception as exc:  # noqa: BLE001 - a harness bug; report it rather than hang the parent
            reply({"fatal": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(), "nonce": msg.get("nonce")})
        finally:
            close_all(msg["fds"])  # what came with the request is mapped by now, or not needed
            close_all(worker.shelf.take_outgoing())  # described for a reply that was not sent
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    main()
