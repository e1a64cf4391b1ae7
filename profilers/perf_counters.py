"""Collector: Linux `perf stat` counters for the worker process while it runs the candidate.

Hardware counters are often unavailable (virtual machines, containers, perf_event_paranoid);
each missing event is reported by name rather than silently dropped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from .base import ProfilerBase
from .report import Counter

__all__ = ["PerfProfiler", "PerfStat"]

_EVENTS = ["task-clock", "cycles", "instructions", "cache-references", "cache-misses", "branch-misses"]


class PerfStat:
    """`with PerfStat() as p: ...` then `p.counters`, `p.note`."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid or os.getpid()
        self.counters: list[Counter] = []
        self.note: str | None = None
        self._proc: subprocess.Popen | None = None
        self._out = None

    def __enter__(self) -> PerfStat:
        perf = shutil.which("perf")
        if perf is None:
            self.note = "perf not found on PATH; install linux-perf for hardware counters"
            return self
        self._out = tempfile.NamedTemporaryFile("w+", suffix=".perf", delete=False)
        try:
            self._proc = subprocess.Popen([perf, "stat", "-x", ",", "-e", ",".join(_EVENTS), "-p", str(self.pid)],
                                          stdout=subprocess.DEVNULL, stderr=self._out)
        except OSError as exc:
            self.note = f"perf could not start: {exc}"
            self._proc = None
        time.sleep(0.1)  # let perf attach before the measured work begins
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        assert self._out is not None
        self._out.seek(0)
        text = self._out.read()
        self._out.close()
        os.unlink(self._out.name)
        self._parse(text)

    def _parse(self, text: str) -> None:
        missing = []
        for line in text.splitlines():
            fields = line.split(",")
            if len(fields) < 3 or fields[2] not in _EVENTS:
                continue
            value, unit, name = fields[0], fields[1], fields[2]
            if value.startswith("<"):
                missing.append(name)
                continue
            try:
                self.counters.append(Counter(name=name, value=float(value), unit=unit))
            except ValueError:
                missing.append(name)
        if missing:
            self.note = (f"perf could not count {', '.join(missing)} on this host (virtual machine or "
                         f"perf_event_paranoid={_paranoid()}); only software events are available")
        elif not self.counters:
            self.note = f"perf produced no counters: {text.strip()[:300]}"


class PerfProfiler(ProfilerBase):
    """`perf stat` on the worker while it runs the profiled calls (CPU backends name it)."""

    name = "perf"
    title = "perf"
    where = "worker"

    def collect(self) -> PerfStat:
        return PerfStat()


def _paranoid() -> str:
    try:
        return open("/proc/sys/kernel/perf_event_paranoid").read().strip()
    except OSError:
        return "?"
