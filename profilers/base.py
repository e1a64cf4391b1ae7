"""The one small protocol every hardware-counter profiler implements, and defaults for it.

A profiler collects counters of the candidate's run in one of two ways (`where`):

* "worker": inside the candidate's own worker, around the profiled calls (`collect()`, a context manager whose
  `counters` and `note` are read after it exits): Linux `perf stat` on CPUs;
* "rerun": the candidate runs once more in a worker started under the profiler's command (`command`), and the
  judge condenses the report it wrote (`read`): Nsight Compute on NVIDIA GPUs.

Which profilers apply to a backend is the backend's word: its probe names its device's counter profiler
(`Availability.hardware_profiler`), and a profiler may also claim a backend itself (`applies_to`). The tools ask the
registry (`kforge.profilers.profiler_for`) and never test a profiler's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ContextManager, Iterable, Literal, Protocol, runtime_checkable

from kforge.backends.base import Availability

from .report import Counter, NcuKernel

__all__ = ["Profiler", "ProfilerBase"]


@runtime_checkable
class Profiler(Protocol):
    #: Its name in the registry, and what a backend's `Availability.hardware_profiler` names.
    name: str
    #: How a person calls it ("Nsight Compute", "perf").
    title: str
    where: Literal["worker", "rerun"]
    #: ("rerun") The report file's suffix (Nsight Compute: ".ncu-rep"); the report is kept as a binary artifact.
    report_suffix: str
    #: ("rerun") Its log's file name among a profile's artifacts.
    log_name: str
    #: ("rerun") Kernel launches it profiles, and how long the run under it may take (seconds).
    launches: int
    timeout_s: float

    def applies_to(self, availability: Availability) -> bool:
        """Whether it profiles this backend on this host."""
        ...

    def collect(self) -> ContextManager[Any]:
        """("worker") Counts while the block runs; the object it yields has `counters` and `note` afterwards."""
        ...

    def command(self, report: Path, log: Path, kernel_names: Iterable[str], *, launches: int) -> list[str] | None:
        """("rerun") The prefix that runs a worker under the profiler, or None where it is not installed."""
        ...

    def install_dir(self, executable: str) -> str:
        """("rerun") What of the host the sandbox around it must let it read."""
        ...

    def log_problem(self, log_text: str) -> str | None:
        """("rerun") Why it collected nothing, in words, from its log."""
        ...

    def read(self, report: Path, custom_names: Iterable[str]) -> list[NcuKernel]:
        """("rerun") The report condensed per kernel launch (in the judge's worker)."""
        ...

    def counters(self, kernels: list[NcuKernel]) -> list[Counter]:
        """("rerun") The hottest custom kernel's metrics as counters."""
        ...


class ProfilerBase:
    """Defaults: applies where the backend names it; neither way of collecting until a subclass gives one."""

    name: str = ""
    title: str = ""
    where: Literal["worker", "rerun"] = "worker"
    report_suffix: str = ""
    log_name: str = "profiler.log"
    launches: int = 3
    timeout_s: float = 300.0

    def applies_to(self, availability: Availability) -> bool:
        return availability.ok and availability.hardware_profiler == self.name

    def collect(self) -> ContextManager[Any]:
        raise NotImplementedError(f"{self.name} does not collect inside the worker")

    def command(self, report: Path, log: Path, kernel_names: Iterable[str], *, launches: int) -> list[str] | None:
        raise NotImplementedError(f"{self.name} does not run the candidate again")

    def install_dir(self, executable: str) -> str:
        return str(Path(executable).resolve().parent)

    def log_problem(self, log_text: str) -> str | None:
        return None

    def read(self, report: Path, custom_names: Iterable[str]) -> list[NcuKernel]:
        return []

    def counters(self, kernels: list[NcuKernel]) -> list[Counter]:
        return []
