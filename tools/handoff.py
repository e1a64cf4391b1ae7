"""Outputs handed from the candidate's process to the judge in place: no copy through a file on disk.

The candidate's worker keeps its outputs alive on an `OutputShelf` and answers with JSON descriptors;
the judge maps them (`open_outputs`), compares, and lets go before the server tells the candidate to
clear its shelf. CUDA tensors travel by CUDA IPC (the judge maps the candidate's device memory, the
`torch.multiprocessing` mechanism without its pickles); CPU tensors through a file-backed tensor in
shared memory (`/dev/shm` where the host has it), which the judge maps privately. The judge rebuilds
only plain tensors of real dtypes from a descriptor and never unpickles anything the candidate made.
"""

from __future__ import annotations

import base64
import math
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

__all__ = ["NonTensor", "OutputShelf", "handoff_directory", "open_outputs", "release_opened", "return_free_memory"]


class NonTensor:
    """Stands in for an output that is not a plain torch.Tensor (only its type's name crosses over)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


@contextmanager
def handoff_directory(home: Path) -> Iterator[Path]:
    """Where a job's CPU outputs are shared: beneath the data directory's handoff root, in memory (`/dev/shm`)
    when the host has it, the one place both workers' sandboxes share (`kforge.tools.sandbox.handoff_root`).
    Removed when the job ends, whatever happened to its workers."""
    from .sandbox import handoff_root

    base = Path(handoff_root(home))
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="job-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class OutputShelf:
    """The candidate's side: outputs held (so their memory stays valid) until `clear`."""

    def __init__(self) -> None:
        self.held: list[Any] = []
        self.files: list[Path] = []

    def put(self, outputs: list[Any], directory: str | None) -> list[dict[str, Any]]:
        return [self._describe(o, directory) for o in outputs]

    def _describe(self, out: Any, directory: str | None) -> dict[str, Any]:
        import torch

        if type(out) is not torch.Tensor:
            return {"non_tensor": type(out).__name__}
        out = out.detach()
        if out.is_cuda:
            from torch.multiprocessing.reductions import reduce_tensor

            try:
                _, a = reduce_tensor(out)
            except RuntimeError:  # memory torch's allocator did not hand out (a foreign buffer): share a copy
                out = out.clone()
                _, a = reduce_tensor(out)
            self.held.append(out)  # the judge maps this very memory: it must outlive the judge's read
            return {"kind": "cuda", "shape": list(a[1]), "stride": list(a[2]), "offset": a[3],
                    "dtype": _dtype_name(out.dtype), "device": a[6], "handle": _b64(a[7]), "size_bytes": a[8],
                    "offset_bytes": a[9], "ref_handle": _b64(a[11]), "ref_offset": a[12],
                    "event": _b64(a[13]) if a[13] else None, "event_sync": bool(a[14]),
                    "where": str(out.device)}
        if directory is None:
            raise RuntimeError("a CPU output needs the job's handoff directory")
        path = Path(directory) / f"{uuid.uuid4().hex}.bin"
        shared = torch.from_file(str(path), shared=True, size=out.numel(), dtype=out.dtype)
        shared.copy_(out.reshape(-1))
        self.files.append(path)
        return {"kind": "file", "name": path.name, "shape": list(out.shape), "dtype": _dtype_name(out.dtype),
                "where": str(out.device)}

    def clear(self) -> None:
        shared_cuda = bool(self.held)
        self.held.clear()
        if shared_cuda:
            # A block sent over CUDA IPC is not freed with its tensor: torch parks it ("limbo") until the
            # sender collects it after the receiver let go, and otherwise only when an allocation fails. Left
            # there, every trial's outputs stayed allocated beside the next trial's (an output's worth of
            # device memory more per step on a several-GB problem).
            import torch

            torch.cuda.ipc_collect()
        for path in self.files:
            path.unlink(missing_ok=True)
        self.files.clear()


def open_outputs(descriptors: list[dict[str, Any]], directory: str | None) -> list[Any]:
    """The judge's side: the candidate's outputs, mapped in place (drop them before the shelf is cleared)."""
    return [_open(d, directory) for d in descriptors]


def _open(d: dict[str, Any], directory: str | None) -> Any:
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
    if d["kind"] == "file" and directory is not None:
        path = Path(directory) / Path(str(d["name"])).name  # only files of this job's directory
        return torch.from_file(str(path), shared=False, size=math.prod(shape), dtype=dtype).view(shape)
    raise ValueError(f"unknown output descriptor kind {d.get('kind')!r}")


def release_opened() -> None:
    """Return mapped CUDA memory to its owner once the judge dropped its references (the owner frees it when
    it collects: `OutputShelf.clear`)."""
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.ipc_collect()


# Cached free device memory a worker keeps within an op. Emptying the cache after each step of a small
# problem only made the next step allocate again: verify's null candidates took 0.08-0.11 s each on a 4096^2
# output (H100) for a comparison that takes 7 ms warm. Between ops the worker keeps less (`kforge.tools.worker`).
_KEEP_WITHIN_OP_BYTES = 2**30


def return_free_memory(device: str, keep_bytes: int = _KEEP_WITHIN_OP_BYTES) -> None:
    """Give the process's cached free blocks back to the GPU between steps when more than `keep_bytes` are
    cached: on a problem of several GB the other worker, or this one's next step, needs the room."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_initialized() \
            and torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > keep_bytes:
        torch.cuda.empty_cache()


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _bytes(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))
