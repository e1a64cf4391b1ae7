"""Host-side helpers shared by backends: the wall-clock timer and CPU facts."""

from __future__ import annotations

import os
import platform
import time

__all__ = ["WallTimer", "cpu_name", "llc_bytes"]


class WallTimer:
    """Host wall-clock timer; CPU work is synchronous, so the bracketed time is the work's time."""

    def __init__(self) -> None:
        self._t0 = self._t1 = 0

    def start(self) -> None:
        self._t0 = time.perf_counter_ns()

    def stop(self) -> None:
        self._t1 = time.perf_counter_ns()

    def elapsed_s(self) -> float:
        return (self._t1 - self._t0) / 1e9

    def host_elapsed_s(self) -> float:
        return self.elapsed_s()


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def llc_bytes() -> int | None:
    """Size of the largest CPU cache that sysfs reports, or None."""
    sizes = []
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(root):
            raw = open(os.path.join(root, entry, "size")).read().strip()
            mult = {"K": 1024, "M": 1024**2}.get(raw[-1], 1)
            sizes.append(int(raw.rstrip("KM")) * mult)
    except (OSError, ValueError):
        return None
    return max(sizes) if sizes else None
