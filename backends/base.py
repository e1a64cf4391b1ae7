"""The small interface every backend implements, and the facts it reports.

A backend knows one kind of device: whether the host offers it (`probe`), how to put tensors and
models there, how to wait for it, how to time a call on it and how to flush its caches between
timed calls. Timing loops, comparisons and profiling are written once in `kforge.tools` against this
interface, the way `triton.testing.do_bench` is written once against `driver.active`.

Everything device-specific is the backend's: how a build is captured (`capture_builds`, `compile_error`), the
environment of a worker whose launches must be synchronous (`sync_launch_env`), the numerics a strict reference
needs (`strict_numerics`), how a device fault reads in an error (`fault_markers`), where inputs are made
(`device`, `kind`), which profilers apply (`hardware_profiler`), and the verified example an agent starts from
(`example_dir`). `BackendBase` gives each a default fit for a CPU-like device, so a new backend writes only what
differs (tests/toy_backend is a whole one in a page).

Backends are imported inside worker processes, where candidate code runs; the server reads their names, the
availability that a probe worker reports, and the plain class facts `kforge.backends.backend_class` gives
(a backend's module must import without torch and without starting its device).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Literal, Mapping, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["OUT_OF_MEMORY_MESSAGES", "Availability", "Backend", "BackendBase", "DeviceFacts", "DeviceKind", "DeviceNodes", "GpuInfo",
           "SharedOutput", "Timer", "map_structure"]

#: "cpu": tensors live in host memory and calls are synchronous; "gpu": a device with its own memory and queue.
DeviceKind = Literal["cpu", "gpu"]
#: Messages of allocators that ran out, whatever the device (CUDA's "out of memory", torch CPU's "can't allocate
#: memory"). A backend's own fault messages are its `fault_markers`.
OUT_OF_MEMORY_MESSAGES = ("out of memory", "can't allocate memory")


class GpuInfo(BaseModel):
    """One GPU of the host, as a probe worker's torch enumerates it (the server itself starts no CUDA)."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(description="The GPU's index on this host, as the `gpu` argument of the tools names it.")
    name: str
    uuid: str | None = Field(default=None, description="As nvidia-smi prints it ('GPU-...'); workers are pinned by it.")
    pci_bus_id: str | None = Field(default=None, description="As nvidia-smi prints it ('00000000:19:00.0').")
    memory_bytes: int | None = None
    pin: dict[str, str] = Field(default_factory=dict, description=(
        "The environment that confines a worker to this GPU alone, as its backend pins one (NVIDIA: "
        "CUDA_VISIBLE_DEVICES=<uuid>); set by the backend's probe."))
    peak_bandwidth_gbs: float | None = Field(default=None, description="Measured device-copy bandwidth, once measured.")
    peak_tflops: dict[str, float] = Field(default_factory=dict, description="Measured matmul rates, once measured.")


class Availability(BaseModel):
    """Whether a backend can run on this host, and if not, why (printed word for word by `doctor`)."""

    model_config = ConfigDict(frozen=True)

    backend: str
    ok: bool
    reason: str = Field(description="Why it is unavailable, or what was found when it is available.")
    device_name: str | None = None
    versions: dict[str, str] = Field(default_factory=dict, description="Toolchain versions found.")
    timing: bool = Field(default=True, description="Whether timings on this backend here mean anything.")
    mode: str | None = Field(default=None, description="A restricted way of running, e.g. 'interpreter'.")
    hardware_profiler: str | None = Field(default=None, description="The counter profiler for this device: 'ncu', 'perf' "
                                          "(a name in `kforge.profilers`' registry), or none.")
    gpus: list[GpuInfo] = Field(default_factory=list, description="Each GPU this backend runs on (none for a CPU).")
    kind: DeviceKind = Field(default="cpu", description="'gpu' for a device with its own memory and queue, else 'cpu'.")
    sync_launch_env: dict[str, str] = Field(default_factory=dict, description="Environment of a worker whose device "
                                            "launches are synchronous, so a fault points at the launch that made it "
                                            "(CUDA_LAUNCH_BLOCKING=1 on NVIDIA GPUs); empty where calls are already.")


class DeviceFacts(BaseModel):
    """What the analyst needs to judge a measurement against the device."""

    model_config = ConfigDict(frozen=True)

    backend: str
    device_name: str
    cores: int | None = None
    cache_bytes: int | None = Field(default=None, description="Largest cache level that a flush must evict.")
    peak_bandwidth_gbs: float | None = None
    peak_tflops: dict[str, float] = Field(default_factory=dict, description="Measured ceilings per dtype.")
    kind: DeviceKind | None = Field(default=None, description="'gpu' or 'cpu' (the backend's `kind`); the analyst "
                                    "picks its remedies by it.")


@dataclass(frozen=True)
class DeviceNodes:
    """The device nodes a worker of a backend may open (`Backend.device_nodes`), which its sandbox allows alone."""

    #: Paths under /dev; () none (a CPU-like device, or a pin to no device); None every node of the host (a pin that
    #: names no device listed here: the worker keeps what it had, and `why_all_open` says so).
    nodes: tuple[str, ...] | None = ()
    why_all_open: str = ""
    #: Environment the worker takes before its device starts, so that its pin names the same device once only these
    #: nodes are open (CUDA counts an index among the GPUs it can open).
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SharedOutput:
    """An output on the device as the judge's process can open it (`Backend.share_output`): the backend's own
    fields of its descriptor, the file descriptor sent with the reply (its memory; None where the fields alone name
    it), and what the candidate's process must keep alive until the judge is done (None for a copy)."""

    fields: dict[str, Any]
    fd: int | None = None
    keep: Any = None


@runtime_checkable
class Timer(Protocol):
    """Brackets one call. `start` and `stop` only mark the window (on a GPU they are queued on the
    stream, so many calls can be timed back to back); `elapsed_s` waits for the device and returns it.

    The timing loop checks separately, on the host clock after a device-wide synchronize, that the
    timer saw all the work (a candidate can hide work on another stream or thread).
    """

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def elapsed_s(self) -> float: ...


@runtime_checkable
class Backend(Protocol):
    """One accelerator kind. Instance methods other than `probe` run only inside a worker process; the class's plain
    attributes and class methods (`preload` in a fork server, `example_dir` in the server) need no device."""

    name: str
    #: torch device string that inputs and models are made on and moved to ("cpu", "cuda").
    device: str
    #: "gpu" for a device with its own memory and queue (weights are initialised there), "cpu" otherwise.
    kind: DeviceKind
    #: Whether an address-space rlimit is safe (GPU runtimes reserve huge virtual ranges; CPU does not).
    limits_address_space: bool
    #: Texts that mark an error as a device fault that leaves the device unusable (the worker is discarded).
    fault_markers: tuple[str, ...]
    #: Environment of a worker whose launches must be synchronous (a fault then points at its launch).
    sync_launch_env: dict[str, str]
    #: Variables of the server's environment a worker inherits for this backend (its toolkit's, its device pin's).
    worker_env_names: tuple[str, ...]
    #: Variables that name its toolchain's directories (CUDA_HOME): a worker's sandbox may read them.
    toolchain_env_names: tuple[str, ...]
    #: Top-level modules whose callables, found in a candidate's module, are kernels it launches itself, compiled at
    #: their first launch (("triton",): jit functions, autotuners, heuristics): the candidate's own, in its profile.
    kernel_modules: tuple[str, ...]
    #: How an operator locks its device's clocks for steady timings ("nvidia-smi -lgc"), named in advice; "" if none.
    lock_clocks_hint: str
    #: The static scan's rules for this device (`kforge.tools.static_scan`): (rule, hard, regex, message) matched
    #: against native source in the candidate's strings ...
    native_scan_rules: tuple[tuple[str, bool, str, str], ...]
    #: ... and against the dotted names it uses in Python (`torch.cuda.Stream`).
    python_scan_rules: tuple[tuple[str, bool, str, str], ...]
    #: Environment of the fork server while it imports (`preload`) so that nothing there starts the device (a device
    #: context does not survive a fork); each forked worker drops it before its job's environment.
    fork_server_env: dict[str, str]
    #: Functions its timer and synchronization call, (module, attribute path): a candidate's process that rebinds one
    #: is tampering (`kforge.tools.harness.integrity`, beside the harness's own: clocks, comparisons, copies).
    watched_functions: tuple[tuple[str, str], ...]
    #: Global flags of its numerics, (label, getter taking the torch module): a change in the candidate's process is
    #: reported, and fails it under strict precision (beside torch's own: default dtype, float32 matmul precision).
    numerics_flags: tuple[tuple[str, Callable[[Any], Any]], ...]

    def probe(self) -> Availability:
        """Say whether this host offers the backend. Never raises."""
        ...

    def setup(self) -> None:
        """Prepare the worker process (threads, default device state) before any user code runs."""
        ...

    def to_device(self, value: Any) -> Any:
        """Move a tensor, module, or a list/tuple/dict of them to the backend's device."""
        ...

    def synchronize(self) -> None:
        """Wait until all work queued on the device has finished."""
        ...

    def timer(self) -> Timer:
        """A fresh timer that measures device time for the calls between start and stop."""
        ...

    def flush_cache(self) -> None:
        """Evict the caches a previous call warmed up; called outside the timed window. On a device with a
        queue (a GPU) it is queued there too, without waiting: the loop times calls back to back."""
        ...

    def clock_state(self) -> tuple[float, tuple[str, ...]] | None:
        """The device's clock (MHz) and why it runs below its maximum now (a power cap, heat), read while a batch
        of timed calls runs; None where the device cannot tell."""
        ...

    def facts(self) -> DeviceFacts:
        """Facts about the device the analyst judges measurements against."""
        ...

    def measure_ceilings(self) -> dict[str, Any]:
        """Measure `peak_bandwidth_gbs` and `peak_tflops` per dtype (seconds; callers cache it)."""
        ...

    def build_defaults(self) -> dict[str, list[str]]:
        """Extra `load_inline` flags this backend adds to every build (e.g. OpenMP, one GPU arch)."""
        ...

    def profiler_activities(self) -> list[Any]:
        """The `torch.profiler.ProfilerActivity` values worth recording on this device."""
        ...

    def jit_kernels(self, module: Any) -> list[dict[str, Any]]:
        """Kernels compiled at first launch from `module` (Triton), with their resources.

        Each dict has the fields of `kforge.backends.build.models.KernelResources`. Backends whose kernels
        are all built at import time (load_inline) return [].
        """
        ...

    def capture_builds(self, builder: Any) -> ContextManager[None]:
        """While user code imports: route its builds through `builder` (a `kforge.backends.build.inline.InlineBuilder`,
        which records them, their diagnostics and resources), and put everything back on exit."""
        ...

    def compile_error(self, exc: BaseException, user_text: str) -> Any:
        """A `kforge.backends.build.models.Diagnostic` locating a kernel compile error that `exc` carries (a Triton
        CompilationError at first launch), or None when `exc` is no compile error of this backend's."""
        ...

    def strict_numerics(self) -> None:
        """Make the reference compute at its dtype's full precision (TF32 and reduced-precision reductions off)."""
        ...

    @classmethod
    def device_nodes(cls, env: Mapping[str, str]) -> DeviceNodes:
        """The device nodes a worker of this backend may open, given its environment (the pin to its device, e.g.
        CUDA_VISIBLE_DEVICES): what its sandbox allows. A class method: the worker asks before its device starts."""
        ...

    @classmethod
    def host_device_nodes(cls) -> list[str]:
        """Every device node of this backend's kind on the host (what a worker the server pinned to none may open;
        descriptors of the others are closed in every worker)."""
        ...

    @classmethod
    def preload(cls) -> dict[str, float]:
        """What a fork server pays once for every worker of this backend (the compilers' identities that build keys
        include), and the seconds of each of its parts, for the fork server's trace. A class method: constructing a
        backend may start its device, and a device context does not survive the fork."""
        ...

    @classmethod
    def device_started_here(cls) -> bool:
        """Whether this process has started the device (the fork server checks after `preload`: its forks could not
        use a device started before the fork)."""
        ...

    def warm_libraries(self) -> None:
        """First uses of the device's math libraries (cuBLAS, cuDNN) that a job would otherwise pay inside a timing."""
        ...

    def share_output(self, out: Any) -> SharedOutput | None:
        """A candidate's output tensor in this device's memory, made openable by the judge's process (another
        process, another sandbox); None for a tensor in host memory, which the harness hands over itself."""
        ...

    def open_output(self, fields: dict[str, Any], dtype: Any, shape: list[int], fd: int | None) -> Any:
        """The judge's side of `share_output`: the output as a tensor, from the fields and descriptor it sent."""
        ...

    def collect_shared(self) -> None:
        """Free what sharing left parked once both sides let go (after the candidate clears its outputs and after
        the judge drops the ones it opened)."""
        ...

    def memory_capacity(self) -> int:
        """Bytes of memory the device has (the host's, for a device that computes in host memory)."""
        ...

    def allocator_memory(self) -> tuple[int, int]:
        """(reserved, allocated): bytes of device memory this process's allocator holds and hands out; (0, 0) for a
        device that computes in host memory or that this process has not started (asking must not start it)."""
        ...

    def release_cached_memory(self) -> None:
        """Give the allocator's cached free blocks back to the device: another process cannot use them."""
        ...

    def reset_memory_peaks(self) -> bool:
        """Count the allocator's peaks afresh; False where there are none to count (host memory, not started)."""
        ...

    def memory_peaks(self) -> list[int]:
        """The allocator's peaks since `reset_memory_peaks`: [reserved, allocated] bytes."""
        ...

    @classmethod
    def example_dir(cls) -> Path | None:
        """The directory of this backend's verified example: candidate.py, and reference.py or problem.txt (a
        problem of the pack). An agent needs one reference example to target a platform. A class method: the
        server reads it without constructing the backend."""
        ...


class BackendBase:
    """Defaults for a CPU-like backend: the host's memory and clock, no cache flush, `load_inline` builds captured,
    no device faults, torch.profiler's CPU activity, the example under `kforge/resources/examples/<name>`.

    A backend subclasses it and overrides what its device does differently; `name` and `probe` it must give.
    """

    name: str = ""
    device: str = "cpu"
    kind: DeviceKind = "cpu"
    limits_address_space: bool = True
    fault_markers: tuple[str, ...] = ()
    sync_launch_env: dict[str, str] = {}
    worker_env_names: tuple[str, ...] = ()
    toolchain_env_names: tuple[str, ...] = ()
    kernel_modules: tuple[str, ...] = ()
    lock_clocks_hint: str = ""
    native_scan_rules: tuple[tuple[str, bool, str, str], ...] = ()
    python_scan_rules: tuple[tuple[str, bool, str, str], ...] = ()
    fork_server_env: dict[str, str] = {}
    watched_functions: tuple[tuple[str, str], ...] = ()
    numerics_flags: tuple[tuple[str, Callable[[Any], Any]], ...] = ()
    # What the host takes now to issue one launch (us), read between timed batches; None where calls launch nothing
    # (a CPU). A host-paced call's speedup is trusted to the extent the two series' hosts issued at one pace.
    launch_cost_us: Callable[[], float] | None = None

    def probe(self) -> Availability:
        raise NotImplementedError(f"backend {self.name!r} must say whether this host offers it")

    @classmethod
    def device_nodes(cls, env: Mapping[str, str]) -> DeviceNodes:
        return DeviceNodes(())  # a device that computes in host memory opens no device node

    @classmethod
    def host_device_nodes(cls) -> list[str]:
        return []

    def available(self, ok: bool, reason: str, **facts: Any) -> Availability:
        """An `Availability` carrying this backend's class facts (kind, synchronous-launch environment)."""
        facts.setdefault("kind", self.kind)
        facts.setdefault("sync_launch_env", dict(self.sync_launch_env))
        return Availability(backend=self.name, ok=ok, reason=reason, **facts)

    def setup(self) -> None:
        return None

    def to_device(self, value: Any) -> Any:
        return map_structure(lambda v: v.to(self.device) if hasattr(v, "to") else v, value)

    def synchronize(self) -> None:
        return None

    def timer(self) -> Timer:
        from .host import WallTimer

        return WallTimer()

    def flush_cache(self) -> None:
        return None

    def clock_state(self) -> tuple[float, tuple[str, ...]] | None:
        """The device's clock (MHz) and the reasons it runs below its maximum now (a power cap, heat), read while
        timed calls run; None where the device cannot tell (a CPU: its timing checks preemption instead)."""
        return None

    def facts(self) -> DeviceFacts:
        from .host import cpu_name

        return DeviceFacts(backend=self.name, device_name=cpu_name(), kind=self.kind)

    def measure_ceilings(self) -> dict[str, Any]:
        from .host import measure_cpu_ceilings

        return measure_cpu_ceilings()

    def build_defaults(self) -> dict[str, list[str]]:
        return {}

    def profiler_activities(self) -> list[Any]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU]

    def jit_kernels(self, module: Any) -> list[dict[str, Any]]:
        return []

    @contextlib.contextmanager
    def capture_builds(self, builder: Any) -> Iterator[None]:
        """`load_inline` goes through `builder` while the block runs (what a backend that builds with it needs)."""
        from torch.utils import cpp_extension

        cpp_extension.load_inline = builder
        try:
            yield
        finally:
            cpp_extension.load_inline = builder.original

    def compile_error(self, exc: BaseException, user_text: str) -> Any:
        return None

    def strict_numerics(self) -> None:
        return None

    @classmethod
    def preload(cls) -> dict[str, float]:
        from .build.fast_build import toolchain_id

        started = time.perf_counter()
        toolchain_id(False)
        return {"C++ toolchain id": round(time.perf_counter() - started, 3)}

    @classmethod
    def device_started_here(cls) -> bool:
        return False  # host memory: nothing to start

    def warm_libraries(self) -> None:
        return None

    def share_output(self, out: Any) -> SharedOutput | None:
        return None  # host memory: the harness shares it as a memory file

    def open_output(self, fields: dict[str, Any], dtype: Any, shape: list[int], fd: int | None) -> Any:
        raise ValueError(f"backend {self.name!r} shares no device memory")

    def collect_shared(self) -> None:
        return None

    def memory_capacity(self) -> int:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def allocator_memory(self) -> tuple[int, int]:
        return (0, 0)  # host memory: the process's own, returned by the system allocator

    def release_cached_memory(self) -> None:
        return None

    def reset_memory_peaks(self) -> bool:
        return False

    def memory_peaks(self) -> list[int]:
        return []

    @classmethod
    def example_dir(cls) -> Path | None:
        return builtin_example_dir(cls.name)


def builtin_example_dir(name: str) -> Path | None:
    """`kforge/resources/examples/<name>` where the package ships an example for `name` (data, not code)."""
    from importlib import resources

    base = resources.files("kforge.resources") / "examples" / name
    return Path(str(base)) if name and (base / "candidate.py").is_file() else None


def map_structure(fn: Callable[[Any], Any], value: Any) -> Any:
    """Apply `fn` to every leaf of nested lists, tuples and dicts."""
    if isinstance(value, (list, tuple)):
        return type(value)(map_structure(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: map_structure(fn, v) for k, v in value.items()}
    return fn(value)
