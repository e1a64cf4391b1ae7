"""What bounds a worker (`WorkerLimits`: deadlines, memory, files, its sandbox, its trace file) and the sandbox it
enters (`confinement`), as the settings give them to the runner, the pool and the builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sandbox import Confinement

__all__ = ["WorkerLimits", "confinement", "sandbox_args"]

@dataclass(frozen=True)
class WorkerLimits:
    timeout_s: float = 600.0
    memory_bytes: int | None = None
    file_bytes: int | None = None
    isolate_network: bool = True
    sandbox: bool = True  # `kforge.tools.process.sandbox` around every worker (off: for debugging only)
    hidden_files: tuple[str, ...] = ()  # files no worker may read (the server's token file)
    read_paths: tuple[str, ...] = ()  # directories builds may read beyond the system's and Python's (headers)
    precompiled_headers: bool = False  # build torch/extension.h once per flag set, in the background
    max_tasks: int = 0  # processes and threads at once per worker (0: the sandbox's default)
    # A candidate's run is called hung after this many times the reference's time for the same calls, but
    # never sooner than the floor (its first launches may JIT-compile) nor later than timeout_s.
    hang_factor: float = 20.0
    hang_floor_s: float = 30.0
    # Not a limit, but every worker and the pool carry these: the file (the settings' `trace`, KFORGE_TRACE) that
    # gets one JSON line per worker start, call and server span (`trace`); None: no trace.
    trace_file: str | None = None

    def hang_deadline(self, reference_call_s: float | None, calls: int) -> tuple[float | None, str]:
        """The deadline of `calls` calls of a candidate, and the words that say where it came from."""
        if not reference_call_s:
            return None, ""
        deadline = min(self.timeout_s, max(self.hang_floor_s, self.hang_factor * reference_call_s * calls))
        return deadline, (f" (the deadline is {self.hang_factor:g}x the reference's {reference_call_s * 1e3:.3g} ms "
                          f"per call for {calls} calls, at least {self.hang_floor_s:g} s)")


def confinement(home: Path, limits: WorkerLimits, scratch: Path | None = None, *,
                gpu_nodes: tuple[str, ...] | None = None) -> Confinement | None:
    """The sandbox a worker (or the server's build) enters, None when it is off; a cold worker's scratch directory
    may lie outside the data directory's jobs/. `gpu_nodes`: the NVIDIA device nodes it may open, () for a build;
    None leaves them to a worker, which picks them by its backend and GPU pin (`sandbox.gpu_nodes`)."""
    if not limits.sandbox:
        return None
    from .sandbox import Confinement

    return Confinement(home=str(home), hidden=limits.hidden_files, isolate_network=limits.isolate_network,
                       extra_writable=(str(scratch),) if scratch else (), extra_readable=limits.read_paths,
                       max_tasks=limits.max_tasks, gpu_nodes=gpu_nodes)


def sandbox_args(home: Path, limits: WorkerLimits, scratch: Path | None = None) -> list[str]:
    """The worker's command-line arguments that ask for its sandbox (none when the sandbox is off)."""
    conf = confinement(home, limits, scratch)
    return ["--sandbox", conf.as_arg()] if conf else []
