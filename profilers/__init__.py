"""Profilers: collectors behind one protocol (`kforge.profilers.base.Profiler`), found through a registry.

Built-in profilers are listed here so a plain checkout finds them; packages add more through the
``kforge.profilers`` entry-point group (``name = "module:Class"``). Modules are imported on first use.
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points
from typing import Any

__all__ = ["binary_report_suffixes", "load_profiler", "profiler_for", "profiler_names"]

_BUILTIN = {
    "ncu": "kforge.profilers.ncu:NcuProfiler",
    "perf": "kforge.profilers.perf_counters:PerfProfiler",
}


@functools.cache  # read once per process: a scan of every installed package's metadata took ~5 ms, per call
def _registry() -> dict[str, str]:
    found = dict(_BUILTIN)
    for ep in entry_points(group="kforge.profilers"):
        found.setdefault(ep.name, ep.value)
    return found


def profiler_names() -> list[str]:
    return sorted(_registry())


def load_profiler(name: str) -> Any:
    """The profiler registered as `name` (a `kforge.profilers.base.Profiler`).

    Raises:
        KeyError: no profiler of that name is registered.
    """
    target = _registry().get(name)
    if target is None:
        raise KeyError(f"unknown profiler {name!r}; known: {', '.join(profiler_names())}")
    module_name, _, cls_name = target.partition(":")
    return getattr(importlib.import_module(module_name), cls_name)()


@functools.cache
def binary_report_suffixes() -> frozenset[str]:
    """The suffixes of the reports the registered rerun profilers write (Nsight Compute's .ncu-rep): a profile's
    artifacts with them are binary, the rest text. A profiler that does not load adds none."""
    found = set()
    for name in profiler_names():
        try:
            suffix = getattr(load_profiler(name), "report_suffix", "")
        except Exception:  # noqa: BLE001 - a broken plug-in must not break the others' artifacts
            continue
        if suffix:
            found.add(suffix)
    return frozenset(found)


def profiler_for(availability: Any) -> Any:
    """The hardware-counter profiler for a backend on this host (a `Profiler`), or None: the one the backend names
    (`Availability.hardware_profiler`) where it is registered, else the first registered one that claims it."""
    named = availability.hardware_profiler
    candidates = ([named] if named in _registry() else []) + [n for n in profiler_names() if n != named]
    for name in candidates:
        try:
            profiler = load_profiler(name)
        except Exception:  # noqa: BLE001 - a broken plug-in must not cost the others their profiles
            continue
        if profiler.applies_to(availability):
            return profiler
    return None
