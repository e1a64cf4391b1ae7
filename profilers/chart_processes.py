"""A profile's charts drawn in processes of their own, side by side, while the profile finishes.

In the server's process the two charts took 0.43-0.51 s on an H100 host (0.22 s warm when drawn alone there,
0.085 s on the CI VM): matplotlib holds the GIL the server's event loop needs while a profile's last worker
ops run, and the two charts were drawn one after the other. Two spawned processes, with matplotlib imported
and its fonts loaded before the first profile, draw one chart each; where they cannot start (or one dies),
the charts are drawn in a thread as before.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable

import anyio

from .charts import Chart, keep, profile_charts, roofline_chart, timing_chart
from .report import ProfileReport

__all__ = ["PendingCharts", "start_chart_processes", "stop_chart_processes"]

logger = logging.getLogger(__name__)

_DRAWERS: tuple[Callable[[ProfileReport], Chart | None], ...] = (timing_chart, roofline_chart)  # profile_charts' order
_executor: ProcessPoolExecutor | None = None
_broken = False
_warmed = False  # in a drawing process: its charts were drawn once


def _warm() -> None:
    """Draw each chart once, of a made-up profile (matplotlib's import, fonts, the Agg canvas, and the code paths of
    the charts themselves: log axes, error bars, the roofline's lines): the first profile's charts then pay only their
    own drawing (they took 0.17 s in a fresh server's first profile, 0.01-0.02 s in the next, H200, 2026-11-29)."""
    from kforge.backends.base import DeviceFacts

    from .report import Baseline, TimingStats

    def stats(label: str, us: float) -> TimingStats:
        return TimingStats.from_samples_s(label, [us * 1e-6 * (1 + 0.01 * i) for i in range(10)])

    device = DeviceFacts(backend="warm", device_name="warm", peak_bandwidth_gbs=1000.0, peak_tflops={"float32": 50.0})
    eager = Baseline(name="eager", timing=stats("eager", 150.0), speedup=1.5, speedup_ci=(1.4, 1.6))
    report = ProfileReport(backend="warm", device_name="warm", collector="warm", candidate=stats("candidate", 100.0),
                           baselines=(eager,), device=device, problem_bytes=1 << 24)
    for variant in (report, report.model_copy(update={"problem_flops": 1 << 30})):  # bandwidth, then FLOP roofline
        for draw in _DRAWERS:
            draw(variant)
    global _warmed
    _warmed = True


def _start(parent: int) -> None:
    """Each drawing process, before its first task: it dies with the server, and it is warm."""
    _die_with(parent)
    try:
        _warm()
    except Exception:  # noqa: BLE001 - a head start only: the first profile's charts then pay it
        logger.exception("warming a drawing process failed")


def _die_with(parent: int) -> None:
    """A drawing process ends with the server, however the server ends (SIGKILL included)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the server died before the request took effect
        os._exit(0)


def start_chart_processes() -> None:
    """Start the drawing processes (spawned: the server's threads and event loop are not copied) and warm them."""
    global _executor
    if _executor is not None or _broken:
        return
    try:
        # Warmed in the initializer: warm-up tasks could all go to the first process to start, leaving the other cold.
        _executor = ProcessPoolExecutor(max_workers=len(_DRAWERS), mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_start, initargs=(os.getpid(),))
        for _ in _DRAWERS:
            _executor.submit(int)  # starts a process each: the executor starts one per task while none is idle
        atexit.register(stop_chart_processes)
    except (OSError, RuntimeError) as exc:
        _give_up(exc)


def stop_chart_processes() -> None:
    global _executor
    if _executor is not None:
        _executor.shutdown(wait=False, cancel_futures=True)
        _executor = None


def _give_up(exc: BaseException) -> None:
    global _broken
    _broken = True
    stop_chart_processes()
    logger.warning("charts are drawn in the server's process: the drawing processes failed (%s: %s)",
                   type(exc).__name__, exc)


def _draw_in_thread(report: ProfileReport, artifacts: Path) -> None:
    for chart in profile_charts(report):
        keep(chart, artifacts)


class PendingCharts:
    """A profile's charts being drawn in the drawing processes from the moment it was made; `keep` waits for them
    and writes them (or draws them in a thread, where the processes are not running)."""

    def __init__(self, report: ProfileReport) -> None:
        self.report = report
        self.futures: list[Future[Chart | None]] | None = None
        if _executor is None:  # not started with the server: started now for the next profiles (they take a second)
            start_chart_processes()
            return
        try:
            self.futures = [_executor.submit(draw, report) for draw in _DRAWERS]
        except (BrokenProcessPool, OSError, RuntimeError) as exc:
            _give_up(exc)

    async def keep(self, artifacts: Path) -> None:
        if self.futures is not None:
            try:
                for future in self.futures:
                    chart = await anyio.to_thread.run_sync(future.result)
                    if chart is not None:
                        keep(chart, artifacts)
                return
            except (BrokenProcessPool, OSError, RuntimeError) as exc:
                _give_up(exc)
        await anyio.to_thread.run_sync(_draw_in_thread, self.report, artifacts)

