"""Outputs handed from the candidate's process to the judge in place: no copy through a file on disk.

The candidate's worker keeps its outputs alive on an `OutputShelf` and answers with JSON descriptors;
the judge maps them (`open_outputs`), compares, and lets go before the server tells the candidate to
clear its shelf. Both kinds travel as a file descriptor with the reply and, through the server, with the
judge's request (`kforge.tools.process.channel`): CUDA tensors as a copy in exportable device memory
(`kforge.tools.harness.cuda_share`: CUDA IPC handles do not open across the workers' PID namespaces), CPU tensors in a
memory file (`memfd`) that the judge maps privately. Where the driver has no exportable memory, CUDA tensors
fall back to CUDA IPC (the `torch.multiprocessing` mechanism without its pickles), which works only without the
sandbox. No directory is shared between the workers (nor between jobs). The judge
rebuilds only plain tensors of real dtypes from a descriptor and never unpickles anything the candidate made.
"""

from __future__ import annotations

import base64
import math
import os
import tempfile
from typing import Any

from ..process.channel import FD_KIND, close_all

__all__ = ["NonTensor", "OutputShelf", "open_outputs", "release_opened", "reserved_device_bytes", "return_free_memory"]


class NonTensor:
    """Stands in for an output that is not a plain torch.Tensor (only its type's name crosses over)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


class OutputShelf:
    """The candidate's side: outputs held (so their memory stays valid) until `clear`."""

    def __init__(self) -> None:
        self.held: list[Any] = []
        self.in_place = False  # some output is shared as the candidate's own memory (CUDA IPC), not a copy
        self.outgoing: list[int] = []  # memory files described since the last reply: sent with it (`take_outgoing`)

    def put(self, outputs: list[Any]) -> list[dict[str, Any]]:
        return [self._describe(o) for o in outputs]

    def take_outgoing(self) -> list[int]:
        """The descriptors the next reply carries (their slots are their places here); the caller closes them
        once sent: the shelf's mapping keeps the memory until `clear`."""
        fds, self.outgoing = self.outgoing, []
        return fds

    def _describe(self, out: Any) -> dict[str, Any]:
        import torch

        if type(out) is not torch.Tensor:
            return {"non_tensor": type(out).__name__}
        out = out.detach()
        if out.is_cuda and _exportable():
            from .cuda_share import export_copy

            fd, size = export_copy(out)
            self.outgoing.append(fd)
            return {"kind": FD_KIND, "memory": "cuda", "slot": len(self.outgoing) - 1, "shape": list(out.shape),
                    "dtype": _dtype_name(out.dtype), "device": out.device.index or 0, "size_bytes": size,
                    "where": str(out.device)}
        if out.is_cuda:
            from torch.multiprocessing.reductions import reduce_tensor

            try:
                _, a = reduce_tensor(out)
            except RuntimeError:  # memory torch's allocator did not hand out (a foreign buffer): share a copy
                out = out.clone()
                _, a = reduce_tensor(out)
            self.held.append(out)  # the judge maps this very memory: it must outlive the judge's read
            self.in_place = True
            return {"kind": "cuda", "shape": list(a[1]), "stride": list(a[2]), "offset": a[3],
                    "dtype": _dtype_name(out.dtype), "device": a[6], "handle": _b64(a[7]), "size_bytes": a[8],
                    "offset_bytes": a[9], "ref_handle": _b64(a[11]), "ref_offset": a[12],
                    "event": _b64(a[13]) if a[13] else None, "event_sync": bool(a[14]),
                    "where": str(out.device)}
        fd = _memory_file(out.numel() * out.element_size())
        shared = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=out.numel(), dtype=out.dtype)
        shared.copy_(out.reshape(-1))
        self.held.append(shared)
        self.outgoing.append(fd)
        return {"kind": FD_KIND, "slot": len(self.outgoing) - 1, "shape": list(out.shape),
                "dtype": _dtype_name(out.dtype), "where": str(out.device)}

    def clear(self) -> None:
        shared_cuda = any(t.is_cuda for t in self.held)
        self.held.clear()
        self.in_place = False
        if shared_cuda:
            # A block sent over CUDA IPC is not freed with its tensor: torch parks it ("limbo") until the
            # sender collects it after the receiver let go, and otherwise only when an allocation fails. Left
            # there, every trial's outputs stayed allocated beside the next trial's (an output's worth of
            # device memory more per step on a several-GB problem).
            import torch

            torch.cuda.ipc_collect()
        close_all(self.take_outgoing())  # described but never sent (the op failed after `put`)


def open_outputs(descriptors: list[dict[str, Any]], fds: list[int]) -> list[Any]:
    """The judge's side: the candidate's outputs, mapped in place (drop them before the shelf is cleared);
    `fds`: the descriptors that came with the request."""
    return [_open(d, fds) for d in descriptors]


def _open(d: dict[str, Any], fds: list[int]) -> Any:
    import torch

    if "non_tensor" in d:
        return NonTensor(str(d["non_tensor"]))
    dtype = getattr(torch, str(d["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {d['dtype']!r}")
    shape = [int(s) for s in d["shape"]]
    if d["kind"] == "cuda":
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        return rebuild_cuda_tensor(torch.Tensor, torch.Size(shape), tuple(int(s) for s in d["stride"]),
                                   int(d["offset"]), torch.UntypedStorage, dtype, int(d["device"]),
                                   _bytes(d["handle"]), int(d["size_bytes"]), int(d["offset_bytes"]), False,
                                   _bytes(d["ref_handle"]), int(d["ref_offset"]),
                                   _bytes(d["event"]) if d["event"] else None, bool(d["event_sync"]))
    if d["kind"] == FD_KIND and d.get("memory") == "cuda" and isinstance(d.get("slot"), int) \
            and 0 <= d["slot"] < len(fds):
        from .cuda_share import import_tensor

        return import_tensor(fds[d["slot"]], int(d["size_bytes"]), int(d["device"]), dtype, shape)
    if d["kind"] == FD_KIND and isinstance(d.get("slot"), int) and 0 <= d["slot"] < len(fds):
        # A private mapping: the judge's reads see the candidate's bytes, and nothing it does reaches them.
        return torch.from_file(f"/proc/self/fd/{fds[d['slot']]}", shared=False, size=math.prod(shape),
                               dtype=dtype).view(shape)
    raise ValueError(f"unknown output descriptor kind {d.get('kind')!r}")


def release_opened() -> None:
    """Return mapped CUDA memory to its owner once the judge dropped its references (the owner frees it when
    it collects: `OutputShelf.clear`)."""
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.ipc_collect()


# Cached free device memory a worker keeps within an op. Emptying the cache after each step of a small
# problem only made the next step allocate again: verify's null candidates took 0.08-0.11 s each on a 4096^2
# output (H100) for a comparison that takes 7 ms warm. Between ops the worker keeps less (`kforge.tools.harness.worker`).
_KEEP_WITHIN_OP_BYTES = 2**30


def return_free_memory(backend: Any, keep_bytes: int = _KEEP_WITHIN_OP_BYTES) -> None:
    """Give the process's cached free blocks back to the device between steps when more than `keep_bytes` are
    cached: on a problem of several GB the other worker, or this one's next step, needs the room."""
    reserved, allocated = backend.allocator_memory()
    if reserved - allocated > keep_bytes:
        backend.release_cached_memory()


def reserved_device_bytes(backend: Any) -> int:
    """What the process's allocator holds of the device's memory (0 for a device that computes in host memory)."""
    return backend.allocator_memory()[0]


_EXPORTABLE: list[bool] = []


def _exportable() -> bool:
    """Whether this process's CUDA driver offers device memory exportable as a descriptor (asked once)."""
    if not _EXPORTABLE:
        from .cuda_share import usable

        _EXPORTABLE.append(usable())
    return _EXPORTABLE[0]


def _memory_file(size: int) -> int:
    """A descriptor of `size` bytes of anonymous memory that another process can map (an unlinked temporary
    file where the system has no memfd)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("kforge-output", os.MFD_CLOEXEC)
    else:  # pragma: no cover - not Linux
        fd = os.dup(tempfile.TemporaryFile().fileno())
    os.ftruncate(fd, max(size, 1))
    return fd


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _bytes(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))
