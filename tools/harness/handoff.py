"""Outputs handed from the candidate's process to the judge in place: no copy through a file on disk.

The candidate's worker keeps its outputs alive on an `OutputShelf` and answers with JSON descriptors;
the judge maps them (`open_outputs`), compares, and lets go before the server tells the candidate to
clear its shelf. An output in a device's memory is the backend's to share (`Backend.share_output`,
`open_output`; NVIDIA's: a copy in exportable device memory, since CUDA IPC handles do not open across the workers'
PID namespaces, `kforge.backends._cuda_share`); a host tensor goes in a memory file (`memfd`) that the judge maps
privately. Both kinds travel as a file descriptor with the reply and, through the server, with the judge's request
(`kforge.tools.process.channel`). No directory is shared between the workers (nor between jobs). The judge
rebuilds only plain tensors of real dtypes from a descriptor and never unpickles anything the candidate made.
"""

from __future__ import annotations

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

    def __init__(self, backend: Any = None) -> None:
        self.backend = backend  # `kforge.backends.*`: shares outputs in its device's memory (None: host memory only)
        self.held: list[Any] = []
        self.in_place = False  # some output is shared as the candidate's own memory (the backend keeps it), not a copy
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
        plain = {"shape": list(out.shape), "dtype": _dtype_name(out.dtype), "where": str(out.device)}
        shared = self.backend.share_output(out) if self.backend is not None else None
        if shared is not None:
            if shared.keep is not None:  # the judge maps this very memory: it must outlive the judge's read
                self.held.append(shared.keep)
                self.in_place = True
            if shared.fd is None:
                return {**shared.fields, **plain, "kind": "device"}
            self.outgoing.append(shared.fd)
            return {**shared.fields, **plain, "kind": FD_KIND, "memory": "device", "slot": len(self.outgoing) - 1}
        fd = _memory_file(out.numel() * out.element_size())
        shared_file = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=out.numel(), dtype=out.dtype)
        shared_file.copy_(out.reshape(-1))
        self.held.append(shared_file)
        self.outgoing.append(fd)
        return {**plain, "kind": FD_KIND, "slot": len(self.outgoing) - 1}

    def clear(self) -> None:
        in_place = self.in_place
        self.held.clear()
        self.in_place = False
        if in_place and self.backend is not None:
            self.backend.collect_shared()  # what the judge mapped in place and let go of (the backend frees it now)
        close_all(self.take_outgoing())  # described but never sent (the op failed after `put`)


def open_outputs(descriptors: list[dict[str, Any]], fds: list[int], backend: Any = None) -> list[Any]:
    """The judge's side: the candidate's outputs, mapped in place (drop them before the shelf is cleared);
    `fds`: the descriptors that came with the request; `backend`: opens those in its device's memory."""
    return [_open(d, fds, backend) for d in descriptors]


def _open(d: dict[str, Any], fds: list[int], backend: Any) -> Any:
    import torch

    if "non_tensor" in d:
        return NonTensor(str(d["non_tensor"]))
    dtype = getattr(torch, str(d["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {d['dtype']!r}")
    shape = [int(s) for s in d["shape"]]
    slot = d.get("slot")
    fd = fds[slot] if d["kind"] == FD_KIND and isinstance(slot, int) and 0 <= slot < len(fds) else None
    if d["kind"] == "device" or (fd is not None and d.get("memory") == "device"):
        if backend is None:
            raise ValueError("an output in device memory, and no backend to open it")
        return backend.open_output(d, dtype, shape, fd)
    if fd is not None:
        # A private mapping: the judge's reads see the candidate's bytes, and nothing it does reaches them.
        return torch.from_file(f"/proc/self/fd/{fd}", shared=False, size=math.prod(shape), dtype=dtype).view(shape)
    raise ValueError(f"unknown output descriptor kind {d.get('kind')!r}")


def release_opened(backend: Any = None) -> None:
    """Let the owner free the device memory the judge mapped, once the judge dropped its references (the owner
    frees it when it collects: `OutputShelf.clear`)."""
    if backend is not None:
        backend.collect_shared()


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
