"""Device memory another process can map through a file descriptor: the CUDA driver's virtual memory management
(VMM) with POSIX file-descriptor handles, through ctypes (worker processes only): how an NVIDIA backend hands a CUDA output from the candidate's process to
the judge's (`NvidiaGpu.share_output`, `open_output`; `kforge.tools.harness.handoff` asks the backend).

Why not CUDA IPC (`cudaIpcGetMemHandle`, what torch.multiprocessing uses): its handles do not open across PID
namespaces, and every sandboxed worker has its own ("invalid device context", H100, driver 580, 2026-11-24;
the driver checks the exporting process's pid). A VMM allocation exported as a descriptor travels like any other
descriptor (`kforge.tools.process.channel`, SCM_RIGHTS), and the allocation lives while a descriptor or a mapping of it
does. The exporter copies an output into such an allocation (one device-to-device copy), sends the descriptor and
lets go; the importer maps it, reads it as a tensor, and unmaps it when the tensor is gone.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from .base import SharedOutput

__all__ = ["collect_shared", "open_output", "share_output", "export_copy", "import_tensor", "usable"]

_PINNED, _POSIX_FD, _ON_DEVICE, _GRANULARITY_MINIMUM, _READ_WRITE = 1, 1, 1, 0, 3


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class CudaShareError(RuntimeError):
    """The driver refused a step (its error name says which)."""


_driver: Any = None
_lock = threading.Lock()


def _cuda() -> Any:
    global _driver
    with _lock:
        if _driver is None:
            _driver = ctypes.CDLL("libcuda.so.1")
        return _driver


def _check(code: int, step: str) -> None:
    if code != 0:
        name = ctypes.c_char_p()
        _cuda().cuGetErrorName(code, ctypes.byref(name))
        raise CudaShareError(f"{step}: {name.value.decode() if name.value else code}")


def _prop(device: int) -> _AllocationProp:
    return _AllocationProp(type=_PINNED, requestedHandleTypes=_POSIX_FD, location=_Location(_ON_DEVICE, device))


def _rounded(nbytes: int, device: int) -> int:
    granularity = ctypes.c_size_t()
    prop = _prop(device)
    _check(_cuda().cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop),
                                                 _GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity")
    g = granularity.value
    return max(g, -(-nbytes // g) * g)


class _Mapping:
    """One allocation mapped into this process; `close` (or dropping it) unmaps it and lets go of the handle."""

    def __init__(self, handle: int, size: int, device: int) -> None:
        cuda = _cuda()
        self.handle, self.size, self.ptr = handle, size, ctypes.c_uint64()
        self._reserved = self._mapped = False
        try:
            _check(cuda.cuMemAddressReserve(ctypes.byref(self.ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                            ctypes.c_uint64(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
            self._reserved = True
            _check(cuda.cuMemMap(self.ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(handle),
                                 ctypes.c_ulonglong(0)), "cuMemMap")
            self._mapped = True
            access = _AccessDesc(_Location(_ON_DEVICE, device), _READ_WRITE)
            _check(cuda.cuMemSetAccess(self.ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1)),
                   "cuMemSetAccess")
        except CudaShareError:
            self.close()
            raise

    def tensor(self, nbytes: int, device: int) -> Any:
        """The first `nbytes` as a uint8 tensor that keeps this mapping alive."""
        import torch

        return torch.as_tensor(_ArrayInterface(self, nbytes), device=f"cuda:{device}")

    def close(self) -> None:
        cuda = _cuda()
        if self._mapped:
            cuda.cuCtxSynchronize()  # nothing may still read or write the range
            cuda.cuMemUnmap(self.ptr, ctypes.c_size_t(self.size))
            self._mapped = False
        if self._reserved:
            cuda.cuMemAddressFree(self.ptr, ctypes.c_size_t(self.size))
            self._reserved = False
        if self.handle:
            cuda.cuMemRelease(ctypes.c_uint64(self.handle))
            self.handle = 0

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone already
            pass


class _ArrayInterface:
    """`__cuda_array_interface__` (version 2: no stream to wait on) over a mapping; torch keeps this object,
    and so the mapping, alive as long as the tensor made from it."""

    def __init__(self, mapping: _Mapping, nbytes: int) -> None:
        self.mapping = mapping
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (mapping.ptr.value, False),
                                         "version": 2, "strides": None}


def usable() -> bool:
    """Whether this process's driver offers exportable allocations."""
    try:
        _rounded(1, 0)
        return True
    except (OSError, CudaShareError, AttributeError):
        return False


def export_copy(tensor: Any) -> tuple[int, int]:
    """Copy a CUDA tensor's values (contiguous, in its shape) into a new exportable allocation; returns
    (descriptor, allocation bytes). The caller sends the descriptor and closes it: the allocation then lives
    until the importer lets go."""
    import torch

    device = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    torch.cuda.set_device(device)  # the driver calls below act on the current thread's context
    nbytes = tensor.numel() * tensor.element_size()
    size = _rounded(nbytes, device)
    handle, prop = ctypes.c_uint64(), _prop(device)
    _check(_cuda().cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop),
                               ctypes.c_ulonglong(0)), "cuMemCreate")
    mapping = _Mapping(handle.value, size, device)
    try:
        with torch.cuda.device(device):
            _view(mapping.tensor(nbytes, device), tensor.dtype, list(tensor.shape)).copy_(tensor)
            torch.cuda.synchronize(device)
        fd = ctypes.c_int(-1)
        _check(_cuda().cuMemExportToShareableHandle(ctypes.byref(fd), ctypes.c_uint64(handle.value), _POSIX_FD,
                                                    ctypes.c_ulonglong(0)), "cuMemExportToShareableHandle")
        return fd.value, size
    finally:
        mapping.close()  # the descriptor holds the allocation now


def import_tensor(fd: int, size: int, device: int, dtype: Any, shape: list[int]) -> Any:
    """The tensor an exporter's descriptor holds (contiguous); the mapping ends when the tensor does. The
    descriptor stays the caller's."""
    import torch

    torch.cuda.set_device(device)
    handle = ctypes.c_uint64()
    _check(_cuda().cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), _POSIX_FD),
           "cuMemImportFromShareableHandle")
    mapping = _Mapping(handle.value, size, device)
    nbytes = 1
    for s in shape:
        nbytes *= s
    nbytes *= _element_size(dtype)
    if nbytes > size:
        mapping.close()
        raise CudaShareError(f"the descriptor holds {size} bytes, the output needs {nbytes}")
    return _view(mapping.tensor(nbytes, device), dtype, shape)


def _view(raw: Any, dtype: Any, shape: list[int]) -> Any:
    return raw.view(dtype).view(shape)


def _element_size(dtype: Any) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


_EXPORTABLE: list[bool] = []


def _exportable() -> bool:
    """Whether this process's CUDA driver offers device memory exportable as a descriptor (asked once)."""
    if not _EXPORTABLE:
        _EXPORTABLE.append(usable())
    return _EXPORTABLE[0]


def share_output(out: Any) -> SharedOutput | None:
    """A CUDA output as the judge's process can open it (`Backend.share_output`); None for a host tensor. A copy in
    exportable memory, sent as a descriptor; where the driver has none, CUDA IPC (the `torch.multiprocessing`
    mechanism without its pickles) of the output's own memory, which works only without the sandbox."""
    if not out.is_cuda:
        return None
    if _exportable():
        fd, size = export_copy(out)
        return SharedOutput({"device": out.device.index or 0, "size_bytes": size}, fd=fd)
    from torch.multiprocessing.reductions import reduce_tensor

    try:
        _, a = reduce_tensor(out)
    except RuntimeError:  # memory torch's allocator did not hand out (a foreign buffer): share a copy
        out = out.clone()
        _, a = reduce_tensor(out)
    # The judge maps this very memory: it must outlive the judge's read (`keep`).
    return SharedOutput({"stride": list(a[2]), "offset": a[3], "device": a[6], "handle": _b64(a[7]),
                         "size_bytes": a[8], "offset_bytes": a[9], "ref_handle": _b64(a[11]), "ref_offset": a[12],
                         "event": _b64(a[13]) if a[13] else None, "event_sync": bool(a[14])}, keep=out)


def open_output(d: dict[str, Any], dtype: Any, shape: list[int], fd: int | None) -> Any:
    """The judge's side of `share_output`: the output mapped (from its descriptor `fd`, else its IPC handle)."""
    if fd is not None:
        return import_tensor(fd, int(d["size_bytes"]), int(d["device"]), dtype, shape)
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return rebuild_cuda_tensor(torch.Tensor, torch.Size(shape), tuple(int(s) for s in d["stride"]),
                               int(d["offset"]), torch.UntypedStorage, dtype, int(d["device"]),
                               _bytes(d["handle"]), int(d["size_bytes"]), int(d["offset_bytes"]), False,
                               _bytes(d["ref_handle"]), int(d["ref_offset"]),
                               _bytes(d["event"]) if d["event"] else None, bool(d["event_sync"]))


def collect_shared() -> None:
    """Free what IPC sharing parked: a block sent over CUDA IPC is not freed with its tensor; torch keeps it ("limbo")
    until the sender collects it after the receiver let go, and otherwise only when an allocation fails. Left there,
    every trial's outputs stayed allocated beside the next trial's."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.ipc_collect()


def _b64(raw: bytes) -> str:
    import base64

    return base64.b64encode(raw).decode("ascii")


def _bytes(text: str) -> bytes:
    import base64

    return base64.b64decode(text.encode("ascii"))
