"""Backends: one module per accelerator behind `kforge.backends.base.Backend`.

Built-in backends are listed here so that a plain checkout (no installed metadata) finds them;
packages may add more through the ``kforge.backends`` entry-point group. Modules are imported on
first use, so listing names never imports torch.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from .base import Availability, Backend, DeviceFacts, GpuInfo, Timer

__all__ = ["Availability", "Backend", "DeviceFacts", "GpuInfo", "Timer", "backend_names", "import_backend_module", "load_backend"]

_BUILTIN = {
    "cpu": "kforge.backends.cpu:CpuBackend",
    "cuda": "kforge.backends.cuda:CudaBackend",
    "triton": "kforge.backends.triton:TritonBackend",
}


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


def load_backend(name: str) -> Backend:
    """Import and construct the backend called `name`.

    Raises:
        KeyError: no backend of that name is registered.
    """
    module_name, cls_name = _target(name)
    return getattr(importlib.import_module(module_name), cls_name)()
