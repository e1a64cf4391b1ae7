"""Holds on new workers that every KForge process of a host sees: servers, and a fleet's node agents.

A pool starts no fork while one of its jobs times or verifies (`WorkerPool.hold_forks`): a fork starts a device
context, and the driver starts contexts one at a time host-wide while allocations on every GPU wait behind them. Two
pools on one host (two servers, or a head and a worker node of a Ray fleet on one machine) did not see each other's
holds: on 2x H200 the fleet's trials ran at 0.16 s at the median against 0.06 s for one server holding for both GPUs
(bench/results, twentieth session). Each pool publishes its strongest hold as a file named by its process id in a
directory of the host's shared memory, and reads the others' (a file whose process is gone, or whose id another
process has taken since, counts for nothing: the file holds its process's start time).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["HostHolds"]


def _started(pid: int | str) -> str | None:
    """A process's start time (clock ticks after boot, /proc/<pid>/stat field 22): with its id, names it uniquely."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def _default_directory() -> Path:
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    return base / f"kforge-holds-{os.getuid() if hasattr(os, 'getuid') else 'user'}"


class HostHolds:
    """This process's hold, published, and the holds of the host's other KForge processes."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or _default_directory()
        self._mine = self.directory / str(os.getpid())
        self._me = _started(os.getpid()) or "?"
        self._published: str | None = None

    def publish(self, state: str | None) -> None:
        """Say that this process holds ("light" or "full"), or holds nothing (None)."""
        if state == self._published:
            return
        try:
            if state is None:
                self._mine.unlink(missing_ok=True)
            else:
                self.directory.mkdir(mode=0o700, exist_ok=True)
                tmp = self._mine.with_suffix(".tmp")
                tmp.write_text(f"{state} {self._me}")
                tmp.replace(self._mine)  # readers see the old state or the new one, never an empty file
            self._published = state
        except OSError:
            pass  # a host without a writable shared directory: the holds stay this process's own, as before

    def others(self) -> tuple[bool, bool]:
        """(a timing holds somewhere else on the host, a verify holds somewhere else)."""
        full = light = False
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return False, False
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                state, _, started = Path(entry.path).read_text().partition(" ")
            except OSError:
                continue
            if _started(entry.name) != started:  # its process is gone (killed before it could say so), or not that one
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
                continue
            full, light = full or state == "full", light or state == "light"
        return full, light

    def close(self) -> None:
        self.publish(None)
