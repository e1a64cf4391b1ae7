"""Each GPU of the host is a device of its own: its own queue, device lock, warm workers and ceilings.

A job of a GPU backend runs on one GPU: the one its `gpu` argument names (an index of the backend's
`Availability.gpus`, which a probe worker enumerated: the server never starts CUDA), else the least
loaded one (fewest queued and running jobs on it; ties go to the lower index). While a tool runs, its
placement lives in a context variable, so every worker the job starts (`ToolContext.worker`, in any of
its tasks) is pinned to that GPU without threading an argument through every helper.

A worker is pinned by the environment its backend's probe gave the GPU (`GpuInfo.pin`; NVIDIA's by UUID,
`CUDA_VISIBLE_DEVICES=GPU-...`): inside the worker the GPU is cuda:0, and the pin holds whatever order CUDA
enumerates devices in. With one GPU (or none) nothing is pinned and the device
keeps the name it always had, so a one-GPU host behaves as before apart from the result naming its GPU.
"""

from __future__ import annotations

import functools
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator, TypeVar

from kforge.backends import Availability, GpuInfo

__all__ = ["Placement", "ceilings_name", "choose_gpu", "current", "describe_gpu", "device_key", "gpu_id", "on_one_gpu",
           "pin_env", "placed_on", "placements"]

R = TypeVar("R")


@dataclass(frozen=True)
class Placement:
    """Where a job runs: one GPU of a backend that has `of` of them."""

    gpu: GpuInfo
    of: int

    @property
    def pinned(self) -> bool:
        # One GPU needs no pin: the worker sees it as cuda:0 already (and the pool keeps today's kinds).
        return self.of > 1


def gpu_id(gpu: GpuInfo) -> str:
    """What tells one GPU from another of the same model: its uuid, else its index (a torch without uuids)."""
    return gpu.uuid or str(gpu.index)


def placements(avail: Availability) -> list[Placement]:
    """A placement on each GPU of the backend (none for a CPU backend)."""
    return [Placement(g, len(avail.gpus)) for g in avail.gpus]


_PLACED: ContextVar[Placement | None] = ContextVar("kforge_gpu_placement", default=None)


def current() -> Placement | None:
    """The GPU the running tool call was placed on (None: a CPU backend, or outside a tool call)."""
    return _PLACED.get()


@contextmanager
def placed_on(placement: Placement | None) -> Iterator[Placement | None]:
    """Run the block (and the tasks it starts) on `placement`."""
    token = _PLACED.set(placement)
    try:
        yield placement
    finally:
        _PLACED.reset(token)


def pin_env(placement: Placement | None) -> dict[str, str]:
    """The environment that confines a worker to the placement's GPU (`GpuInfo.pin`, the backend's: set before the
    device starts, which reads it once); none where one GPU needs no pin."""
    if placement is None or not placement.pinned:
        return {}
    return dict(placement.gpu.pin)


def device_key(avail: Availability, placement: Placement | None) -> str:
    """The device a job queues for and times on: each GPU of a multi-GPU host, else the backend's device (as before).

    The same for every backend on a GPU (`cuda` and `triton` share it), so they never time on it at once."""
    if placement is None or placement.of < 2:
        return avail.device_name or avail.backend
    return f"GPU {placement.gpu.index} ({placement.gpu.name})"


def pin_key(placement: Placement | None) -> str:
    """The pin of `placement` as one string (the kept workers' keys, `steps.kept_key`)."""
    return ",".join(f"{k}={v}" for k, v in sorted(pin_env(placement).items()))


def choose_gpu(avail: Availability, requested: int | None, load: Callable[[Placement], int],
               kept_on: Callable[[Placement], bool] = lambda p: False) -> Placement | None:
    """The placement of a job of `avail`'s backend: GPU `requested`, else the least loaded one (then the lowest index),
    where a GPU that keeps a worker for the job's code (`kept_on`: its compile's or verify's candidate) counts one
    call less loaded: the job then needs no new process.

    None for a backend without GPUs (CPU); RequestError (from `kforge.tools.context`) for an index out of range
    or a GPU asked of a backend that has none."""
    from .tool_inputs import RequestError

    choices = placements(avail)
    if not choices:
        if requested is not None:
            raise RequestError(f"backend {avail.backend!r} runs on no GPU here, so gpu={requested} cannot be served; "
                               "leave gpu out")
        return None
    if requested is None:
        return min(choices, key=lambda p: (load(p) - kept_on(p), not kept_on(p), p.gpu.index))
    for p in choices:
        if p.gpu.index == requested:
            return p
    there = ", ".join(f"{g.index} ({g.name})" for g in avail.gpus)
    raise RequestError(f"gpu={requested} is out of range: this host's {avail.backend} GPUs are {there}; "
                       "leave gpu out to take the least loaded one")


def ceilings_name(backend: str, device_name: str, torch_version: str, gpu_id: str | None = None) -> str:
    """The file a device's measured ceilings are cached in (`cache/ceilings/`): per GPU where a host has several
    (`gpu_id`, its uuid: a GPU is measured, not its model), else per device model as before."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{backend}-{device_name}-torch{torch_version}"
                  + (f"-{gpu_id}" if gpu_id else ""))
    return f"{slug.strip('-')}.json"


def describe_gpu(gpu: GpuInfo) -> str:
    """One GPU as list_backends and doctor print it."""
    memory = f", {gpu.memory_bytes / 2**30:.0f} GiB" if gpu.memory_bytes else ""
    rates = ", ".join(f"{dtype} {rate:g} TFLOP/s" for dtype, rate in gpu.peak_tflops.items())
    measured = (f"; measured ceilings: copy {gpu.peak_bandwidth_gbs:g} GB/s" + (f"; matmul {rates}" if rates else "")
                if gpu.peak_bandwidth_gbs else "")
    bus = f", bus {gpu.pci_bus_id}" if gpu.pci_bus_id else ""
    return f"GPU {gpu.index}: {gpu.name} ({gpu.uuid or 'no uuid'}{memory}{bus}){measured}"


def on_one_gpu(tool: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """A tool function `tool(ctx, request, ...)` that runs on the GPU its request names (`request.gpu`, an index;
    None: the least loaded GPU) (`ToolContext.on_gpu`); a backend without GPUs runs as before. A decorator rather than an argument
    threaded through every helper: what the placement changes (the workers' pin, the device lock, the ceilings,
    the baselines' key) is read where it is used."""
    @functools.wraps(tool)
    async def run(ctx: Any, request: Any, *args: Any, **kwargs: Any) -> R:
        async with ctx.on_gpu(request.backend, request.gpu, getattr(request, "candidate_code", None)):
            return await tool(ctx, request, *args, **kwargs)
    return run
