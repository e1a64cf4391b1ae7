"""What the candidate's process must leave alone, snapshotted before user code runs (worker only).

The timing loop and result channel live in the candidate's worker, so a candidate could patch a
timer, `synchronize` or a tensor method, flip global numerics flags, or leave a thread or child
process working after a call returns (its work would escape the timer). A `HarnessSnapshot` is
taken at worker start; `changes()` lists what differs now, in words.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import torch

from kforge.backends.host import process_ids, process_stat  # noqa: F401 - re-exported for the harness

__all__ = ["HarnessSnapshot", "child_processes", "process_ids", "process_stat", "session_processes"]

# (module path, attribute path): functions the harness calls on any device; rebinding any of them is tampering. Its
# backend adds those of its own timer and synchronization (`Backend.watched_functions`).
_WATCHED = [
    ("time", "perf_counter"), ("time", "perf_counter_ns"), ("time", "monotonic"), ("time", "time"),
    ("torch", "equal"), ("torch", "allclose"), ("torch", "isclose"), ("torch", "save"), ("torch", "load"),
    ("torch.testing", "assert_close"), ("torch", "Tensor.clone"), ("torch", "Tensor.cpu"), ("torch", "Tensor.to"),
    ("torch", "Tensor.__eq__"), ("torch", "Tensor.copy_"), ("torch", "Tensor.detach"), ("json", "dumps"),
]
# Global numerics flags of torch itself: (label, getter). A change is reported; under strict precision it fails. Its
# backend adds its device's (`Backend.numerics_flags`: TF32 and reduced-precision reductions on a GPU).
_FLAGS = [
    ("torch.get_float32_matmul_precision()", lambda t: t.get_float32_matmul_precision()),
    ("torch.get_default_dtype()", lambda t: t.get_default_dtype()),
]


def _resolve(module: str, path: str) -> Any:
    import importlib

    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def child_processes() -> list[int]:
    """Live child processes of this process (Linux /proc; [] elsewhere); exited, unreaped ones do no work."""
    kids: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        try:
            kids += [int(p) for p in task.read_text().split()]
        except OSError:
            continue
    return [pid for pid in kids if (st := process_stat(pid)) is not None and st[1] != "Z"]


def session_processes() -> list[int]:
    """Live processes of the session this process leads, other than itself (Linux /proc; [] elsewhere).

    A worker leads a session of its own, so this finds what it started however it was started: a
    grandchild whose parent exited (a double fork) is no longer a child, but still in the session.
    Only a process that leads its session looks: under a profiler (ncu) the session is the profiler's.
    """
    me = os.getpid()
    if os.getsid(0) != me:
        return []
    return [int(pid) for pid in process_ids()
            if int(pid) != me and (st := process_stat(pid)) is not None and st[3] == me and st[1] != "Z"]


def _describe(pid: int) -> str:
    st = process_stat(pid)
    name = f" ({st[0]})" if st else ""
    return f"child process {pid}{name}" if st and st[2] == os.getpid() else f"process {pid}{name} of its session"


class HarnessSnapshot:
    def __init__(self, backend: Any = None) -> None:
        """Taken before user code runs, for the worker's `backend` (its timer's functions and its numerics flags too)."""
        self._functions = {(m, p): _resolve(m, p)
                           for m, p in [*_WATCHED, *getattr(backend, "watched_functions", ())]}
        self._flag_getters = [*getattr(backend, "numerics_flags", ()), *_FLAGS]
        self._flags = {label: get(torch) for label, get in self._flag_getters}
        self._threads = {t.ident for t in threading.enumerate()}

    def tampering(self) -> list[str]:
        """Harness functions that are no longer the originals."""
        changed = []
        for (module, path), original in self._functions.items():
            try:
                now = _resolve(module, path)
            except (AttributeError, ImportError):
                now = None
            if now is not original:
                changed.append(f"{module}.{path} was replaced")
        return changed

    def flag_changes(self) -> list[str]:
        return [f"{label}: {before!r} -> {get(torch)!r}"
                for (label, get), before in zip(self._flag_getters, self._flags.values()) if get(torch) != before]

    def new_threads(self) -> list[str]:
        return [f"thread {t.name!r} ({'daemon' if t.daemon else 'non-daemon'})" for t in threading.enumerate()
                if t.ident not in self._threads and t.is_alive()]

    def background_work(self) -> list[str]:
        """Threads alive now that were not there at start, and processes this worker left running.

        Every process counts (children, and the rest of the worker's session): none of KForge's own runs
        there after a call (the server starts its header builds, `build_service.spawn_pch_build`), so no
        process is exempted by name or kind, which a candidate could imitate.
        """
        pids = sorted(set(child_processes()) | set(session_processes()))
        return self.new_threads() + [_describe(pid) for pid in pids]

