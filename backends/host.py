"""Host-side helpers: the wall-clock timer, CPU facts, and /proc's process table (the build machinery and the
server's process plumbing read it, so it lives in the lowest part that needs it, public to the packages above)."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

__all__ = ["WallTimer", "cpu_name", "llc_bytes", "llc_layout", "process_ids", "process_stat"]


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


def process_ids() -> list[str]:
    """Every process this process can see in /proc ([] where there is none)."""
    try:
        return [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return []


def process_stat(pid: int | str) -> tuple[str, str, int, int] | None:
    """(name, state, parent, session) of a process, from /proc/<pid>/stat; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...
        return stat[stat.index("(") + 1:stat.rindex(")")], fields[0], int(fields[1]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def llc_layout() -> tuple[int, int] | None:
    """(bytes of one last-level cache, how many distinct ones serve this process's CPUs), from sysfs, or None."""
    caches: dict[str, tuple[int, int]] = {}  # shared_cpu_list -> (level, bytes), of the deepest data cache
    for cpu in sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]:
        for index in Path(f"/sys/devices/system/cpu/cpu{cpu}/cache").glob("index*"):
            try:
                if (index / "type").read_text().strip() == "Instruction":
                    continue
                level = int((index / "level").read_text())
                raw = (index / "size").read_text().strip()
                size = int(raw.rstrip("KMG")) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(raw[-1], 1)
                caches[(index / "shared_cpu_list").read_text().strip() + f"@{level}"] = (level, size)
            except (OSError, ValueError):
                continue
    if not caches:
        return None
    top = max(level for level, _ in caches.values())
    sizes = [size for level, size in caches.values() if level == top]
    return max(sizes), len(sizes)


def llc_bytes() -> int | None:
    """Size of one last-level cache that sysfs reports, or None. (It read each entry of the cache directory as
    a cache, `uevent` among them, and so always answered None.)"""
    layout = llc_layout()
    return layout[0] if layout else None


def measure_cpu_ceilings() -> dict:
    """Measured copy bandwidth and fp32 matmul rate of this CPU (a few seconds, cached by the caller)."""
    import torch

    src = torch.ones(64 * 1024**2 // 4)  # 64 MiB: well past the last-level cache
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(10):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    bandwidth_gbs = 2 * src.numel() * 4 / best / 1e9  # bytes read plus bytes written
    a = torch.randn(1024, 1024)
    torch.mm(a, a)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, a)
        best = min(best, time.perf_counter() - t0)
    return {"peak_bandwidth_gbs": round(bandwidth_gbs, 2),
            "peak_tflops": {"float32": round(2 * 1024**3 / best / 1e12, 4)}}
