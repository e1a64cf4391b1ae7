"""Where a server's host spends its cores during a measured window: the host's CPUs, the server process, its workers.

`bench/gpu_throughput.py` measured 1 GPU against 2 on one host (H200 x2, 2026-11-27): with 2 GPUs the jobs queued
far less (verify 11.4 -> 1.0 s) but each ran ~2.5x longer (verify 6.9 -> 17.2 s), so throughput stayed flat (1.03x).
Something the whole host shares was the limit. This sampler tells which, in the run that shows it:

- `host_busy`: the fraction of all CPUs busy (/proc/stat), mean and 90th percentile: near 1, the host's cores;
- `server_cores`: the server process's own CPU (utime + stime, in cores): near 1, its one event loop;
- `kforge_cores`: the server and every process below it (workers, zygotes, compilers), in cores;
- `kforge_processes` / `kforge_threads`: how many there were, mean and max (oversubscription shows as threads).

Linux only (/proc); elsewhere it reports nothing. A thread samples every `every_s` until `stop()`.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["HostLoad", "cpu_busy"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far, from /proc/stat (idle and iowait are not busy); (0, 0) without it."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return 0, 0
    return sum(fields) - fields[3] - fields[4], sum(fields)


def _processes() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, utime + stime in ticks, threads) of every process readable now."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path("/proc", name, "stat").read_text()
        except OSError:
            continue  # gone since the listing
        rest = text[text.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid ... (comm may hold spaces)
        found[int(name)] = (int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[17]))
    return found


def _below(root: int, procs: dict[int, tuple[int, int, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in procs and pid not in tree:
            tree.add(pid)
            todo += children.get(pid, [])
    return tree


class HostLoad:
    """Samples the host and the process tree under `root` (a server's pid) from `start()` to `stop()`; the trees under
    `also` count with it (a local Ray cluster's processes, which are not the server's children)."""

    def __init__(self, root: int, every_s: float = 0.5, also: tuple[int, ...] = ()) -> None:
        self.root, self.every_s, self.also = root, every_s, also
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HostLoad:
        if os.path.exists("/proc/stat"):
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        host, procs, at = cpu_busy(), _processes(), time.monotonic()
        while not self._stop.wait(self.every_s):
            host2, procs2, at2 = cpu_busy(), _processes(), time.monotonic()
            tree = set().union(*(_below(r, procs2) for r in (self.root, *self.also)))
            # CPU a process used since the last sample (a new one: all of its own, spent since its start)
            used = {pid: procs2[pid][1] - (procs[pid][1] if pid in procs else 0) for pid in tree}
            seconds = (at2 - at) * _TICK
            self.samples.append({
                "host_busy": (host2[0] - host[0]) / max(1, host2[1] - host[1]),
                "server_cores": used.get(self.root, 0) / seconds,
                "kforge_cores": sum(max(0, u) for u in used.values()) / seconds,
                "kforge_processes": len(tree),
                "kforge_threads": sum(procs2[pid][2] for pid in tree)})
            host, procs, at = host2, procs2, at2

    def stop(self) -> dict[str, Any]:
        """The window's summary: mean and 90th percentile (max for counts) of each series, and the sample count."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not self.samples:
            return {"samples": 0}
        out: dict[str, Any] = {"samples": len(self.samples), "cpus": os.cpu_count()}
        for key in self.samples[0]:
            values = sorted(s[key] for s in self.samples)
            p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
            out[key] = {"mean": round(statistics.fmean(values), 3), "p90": round(p90, 3), "max": round(values[-1], 3)}
        return out
