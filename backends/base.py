"""The small interface every backend implements, and the facts it reports.

A backend knows one kind of device: whether the host offers it (`probe`), how to put tensors and
models there, how to wait for it, how to time a call on it and how to flush its caches between
timed calls. Timing loops, comparisons and profiling are written once in `kforge.tools` against this
interface, the way `triton.testing.do_bench` is written once against `driver.active`.

Backends are imported inside worker processes, where candidate code runs; the server only reads
their names and the availability that a probe worker reports.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Availability", "Backend", "DeviceFacts", "GpuInfo", "Timer"]


class GpuInfo(BaseModel):
    """One GPU of the host, as a probe worker's torch enumerates it (the server itself starts no CUDA)."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(description="The GPU's index on this host, as the `gpu` argument of the tools names it.")
    name: str
    uuid: str | None = Field(default=None, description="As nvidia-smi prints it ('GPU-...'); workers are pinned by it.")
    pci_bus_id: str | None = Field(default=None, description="As nvidia-smi prints it ('00000000:19:00.0').")
    memory_bytes: int | None = None
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
    hardware_profiler: str | None = Field(default=None, description="The counter profiler for this device: 'ncu', 'perf'.")
    gpus: list[GpuInfo] = Field(default_factory=list, description="Each GPU this backend runs on (none for a CPU).")


class DeviceFacts(BaseModel):
    """What the analyst needs to judge a measurement against the device."""

    model_config = ConfigDict(frozen=True)

    backend: str
    device_name: str
    cores: int | None = None
    cache_bytes: int | None = Field(default=None, description="Largest cache level that a flush must evict.")
    peak_bandwidth_gbs: float | None = None
    peak_tflops: dict[str, float] = Field(default_factory=dict, description="Measured ceilings per dtype.")


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
    """One accelerator kind. Methods other than `probe` run only inside a worker process."""

    name: str
    #: torch device string that inputs and models are moved to ("cpu", "cuda").
    device: str
    #: Whether an address-space rlimit is safe (GPU runtimes reserve huge virtual ranges; CPU does not).
    limits_address_space: bool

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

        Each dict has the fields of `kforge.tools.models.KernelResources`. Backends whose kernels
        are all built at import time (load_inline) return [].
        """
        ...


def map_structure(fn: Callable[[Any], Any], value: Any) -> Any:
    """Apply `fn` to every leaf of nested lists, tuples and dicts."""
    if isinstance(value, (list, tuple)):
        return type(value)(map_structure(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: map_structure(fn, v) for k, v in value.items()}
    return fn(value)
