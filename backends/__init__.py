"""Backends: one module per accelerator behind `kforge.backends.base.Backend`.

Built-in backends are listed here so that a plain checkout (no installed metadata) finds them;
packages may add more through the ``kforge.backends`` entry-point group. Modules are imported on
first use, so listing names never imports torch.
"""

from __future__ import annotations

import functools
import importlib
import os
from importlib.metadata import entry_points

from pathlib import Path
from typing import Any, Mapping

from .base import (OUT_OF_MEMORY_MESSAGES, Availability, Backend, BackendBase, DeviceFacts, DeviceNodes, GpuInfo, SharedOutput,
                   Timer)

__all__ = ["OUT_OF_MEMORY_MESSAGES", "Availability", "Backend", "BackendBase", "DeviceFacts", "DeviceNodes", "GpuInfo",
           "SharedOutput", "Timer", "backend_class", "backend_names", "device_nodes", "example_dir", "fault_markers", "host_device_nodes",
           "import_backend_module", "is_device_fault", "is_out_of_memory", "kernel_modules", "load_backend", "scan_rules",
           "toolchain_homes", "worker_env_names"]

_BUILTIN = {
    "cpu": "kforge.backends.cpu:CpuBackend",
    "cuda": "kforge.backends.cuda:CudaBackend",
    "triton": "kforge.backends.triton:TritonBackend",
}


@functools.cache  # read once per process: a scan of every installed package's metadata took ~5 ms, per call
def _registry() -> dict[str, str]:
    found = dict(_BUILTIN)
    for ep in entry_points(group="kforge.backends"):
        found.setdefault(ep.name, ep.value)
    return found


def backend_names() -> list[str]:
    """Every backend KForge knows of, available on this host or not."""
    return sorted(_registry())


def _target(name: str) -> tuple[str, str]:
    target = _registry().get(name)
    if target is None:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(backend_names())}")
    module_name, _, cls_name = target.partition(":")
    return module_name, cls_name


def import_backend_module(name: str) -> None:
    """Import the backend's module only: constructing a backend may start the device (a fork server's
    preload must not)."""
    importlib.import_module(_target(name)[0])


def backend_class(name: str) -> type:
    """The backend's class, not constructed (constructing may start the device): its plain facts (`fault_markers`,
    `sync_launch_env`, `preload`) are read from it.

    Raises:
        KeyError: no backend of that name is registered.
    """
    module_name, cls_name = _target(name)
    return getattr(importlib.import_module(module_name), cls_name)


@functools.cache  # the verdict asks once per trial
def fault_markers() -> tuple[str, ...]:
    """Texts that mark an error as a device fault on any registered backend (a verdict that names one is an
    answer about the run, never about the code). A backend whose module cannot be imported adds none."""
    found: list[str] = []
    for name in backend_names():
        try:
            markers = getattr(backend_class(name), "fault_markers", ())
        except Exception:  # noqa: BLE001 - a broken plug-in must not break verdicts on the others
            continue
        found += [m for m in markers if m not in found]
    return tuple(found)


@functools.cache
def worker_env_names() -> tuple[str, ...]:
    """The server's variables a worker inherits for some registered backend (`Backend.worker_env_names`)."""
    return tuple(dict.fromkeys(n for cls in _classes() for n in getattr(cls, "worker_env_names", ())))


@functools.cache
def kernel_modules() -> tuple[str, ...]:
    """Top-level modules whose callables in a candidate's module are kernels it launches itself, for any registered
    backend (`Backend.kernel_modules`: a cuda candidate may define Triton kernels too)."""
    return tuple(dict.fromkeys(m for cls in _classes() for m in getattr(cls, "kernel_modules", ())))


def toolchain_homes() -> list[str]:
    """The directories some registered backend's toolchain lives in, as this process's environment names them
    (`Backend.toolchain_env_names`): a worker's sandbox lets it read them (headers, compilers, libraries)."""
    names = dict.fromkeys(n for cls in _classes() for n in getattr(cls, "toolchain_env_names", ()))
    return [os.environ[n] for n in names if os.environ.get(n)]


@functools.cache
def scan_rules(backend: str | None) -> tuple[tuple[tuple[str, bool, str, str], ...], tuple[tuple[str, bool, str, str], ...]]:
    """The static scan's (native, Python) rules of `backend` (`Backend.native_scan_rules`, `python_scan_rules`); of
    every registered backend for None or a name not known here (a candidate may target any of them)."""
    classes = _classes_for(backend)
    native = tuple(dict.fromkeys(r for c in classes for r in getattr(c, "native_scan_rules", ())))
    python = tuple(dict.fromkeys(r for c in classes for r in getattr(c, "python_scan_rules", ())))
    return native, python


def _classes() -> list[Any]:
    """Every registered backend's class that imports (a broken plug-in must not break the others)."""
    found = []
    for name in backend_names():
        try:
            found.append(backend_class(name))
        except Exception:  # noqa: BLE001
            continue
    return found


def _classes_for(backend: str | None) -> list[Any]:
    """`backend`'s class; every registered backend's for None or a name not known here (or whose module does not
    import): a worker of no named backend may use any device, and a candidate may target any of them."""
    if backend:
        try:
            return [backend_class(backend)]
        except Exception:  # noqa: BLE001 - unknown, or a plug-in that does not import
            pass
    return _classes()


def host_device_nodes() -> list[str]:
    """Every device node of every registered backend on this host (`Backend.host_device_nodes`)."""
    nodes: list[str] = []
    for cls in _classes():
        nodes += [n for n in getattr(cls, "host_device_nodes", lambda: [])() if n not in nodes]
    return nodes


def device_nodes(backend: str | None, env: Mapping[str, str]) -> DeviceNodes:
    """The device nodes a worker of `backend` with environment `env` may open (`Backend.device_nodes`). For no
    backend (the probe, a profiler's run) or one not known here: what every registered backend's pin allows, since
    such a worker may start any device (every node where one backend leaves them all open)."""
    picked = [cls.device_nodes(env) for cls in _classes_for(backend) if hasattr(cls, "device_nodes")]
    if len(picked) == 1:
        return picked[0]
    env_updates = {k: v for p in picked for k, v in p.env.items()}
    if open_all := [p for p in picked if p.nodes is None]:
        return DeviceNodes(None, next((p.why_all_open for p in open_all if p.why_all_open), ""), env_updates)
    return DeviceNodes(tuple(dict.fromkeys(n for p in picked for n in p.nodes or ())), "", env_updates)


def is_device_fault(text: str, backend: Any = None) -> bool:
    """Whether an error's text names a device fault: one of `backend`'s (a class or an instance), or with none
    given, of any registered backend's. The one test the loader, the verdict and verify's rerun all use."""
    markers = getattr(backend, "fault_markers", ()) if backend is not None else fault_markers()
    return any(m in text for m in markers or ())


def is_out_of_memory(text: str) -> bool:
    """Whether an error's text says that host or device memory ran out (`OUT_OF_MEMORY_MESSAGES`)."""
    lowered = text.lower()
    return any(m in lowered for m in OUT_OF_MEMORY_MESSAGES)


def example_dir(name: str) -> Path | None:
    """The directory of backend `name`'s verified example (candidate.py, and reference.py or problem.txt), or None.

    Asked of the backend's class (`Backend.example_dir`): constructing it may start the device, and the example is
    data beside the backend, not a fact of this host."""
    try:
        cls: Any = backend_class(name)
    except Exception:  # noqa: BLE001 - unknown, or a plug-in that does not import
        return None
    finder = getattr(cls, "example_dir", None)
    if finder is None:
        return None
    found = finder()
    return Path(found) if found is not None else None


def load_backend(name: str) -> Backend:
    """Import and construct the backend called `name`.

    Raises:
        KeyError: no backend of that name is registered.
    """
    module_name, cls_name = _target(name)
    return getattr(importlib.import_module(module_name), cls_name)()
