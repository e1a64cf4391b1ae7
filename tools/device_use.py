"""Who uses a device at a time: correctness runs together, a timing alone.

A timing measures the device: any kernel beside it, another job's verify trials included, is in its numbers
(before this, a timing took a lock that only other timings took). So a timing waits for the runs under way on its
device to end, and runs that arrive while a timing waits or runs wait for it (the timing first: otherwise a
stream of verifies keeps a profile waiting forever). It did not make profiles under concurrent jobs trusted: on
one H100 with two clients (2026-11-25, `bench/gpu_throughput.py`) every relu profile was untrusted
(wall_clock_anchor, stable_timing) before and after it, with outliers of 3-5x the median; that cause is open.
Builds take nothing: they use the CPU's cores, not the device.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio

__all__ = ["DeviceUse"]


class DeviceUse:
    """A readers-writer lock for one device (`ToolContext.device_use`): `run()` shared, `timing()` alone."""

    def __init__(self) -> None:
        self._runs = 0
        self._timing = False
        self._timings_waiting = 0
        self._runs_waiting = 0
        self._changed = anyio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """A job's correctness work on the device: beside other runs, never beside a timing."""
        self._runs_waiting += 1
        try:
            while self._timing or self._timings_waiting:
                await self._changed.wait()
        finally:
            self._runs_waiting -= 1
        self._runs += 1
        try:
            yield
        finally:
            self._runs -= 1
            self._notify()

    @asynccontextmanager
    async def timing(self) -> AsyncIterator[None]:
        """A job's timing: alone on the device (no run, no other timing)."""
        self._timings_waiting += 1
        try:
            while self._timing or self._runs:
                await self._changed.wait()
        finally:
            self._timings_waiting -= 1
            self._notify()  # a cancelled wait lets the runs held behind it go on
        self._timing = True
        try:
            yield
        finally:
            self._timing = False
            self._notify()

    async def give_way(self, until: Callable[[], Awaitable[None]] | None = None) -> None:
        """Within a timing that no job waits on (a warm-up's timing ahead): let the runs and timings waiting for the
        device go first, and `until()` return, then take it back. A warm-up's rounds held the next candidate's verify
        for 0.7 s when the agent asked at once (H200, 2026-12-02); between rounds nothing is lost, as each round has
        its own canary."""
        if not self.contended and until is None:
            return
        self._timing = False
        self._notify()
        if until is not None:
            await until()
        while self._timing or self._runs or self._runs_waiting or self._timings_waiting:
            await self._changed.wait()
        self._timing = True

    @property
    def contended(self) -> bool:
        """Whether a run or a timing waits for the device."""
        return bool(self._runs_waiting or self._timings_waiting)

    @property
    def busy(self) -> str:
        """What holds it now, for a message."""
        return "a timing" if self._timing else f"{self._runs} correctness run(s)" if self._runs else "nothing"
