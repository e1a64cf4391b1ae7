"""CPU backend: C++ kernels built with `torch.utils.cpp_extension.load_inline` and OpenMP.

Threads: the candidate's `#pragma omp parallel`, eager's ATen kernels and torch.compile's generated C++
all run on OpenMP teams started from the timing thread. `setup` gives every OpenMP runtime in the worker
the same team size (torch's own through `torch.set_num_threads`, any runtime loaded later through
OMP_NUM_THREADS), and `threads()` reports it after checking each loaded runtime (`openmp_runtimes`).
With torch's pip wheels a candidate's `-fopenmp` library binds to torch's own libgomp (torch loads it
RTLD_GLOBAL), so there is one thread pool, shared by the cache flush and the candidate.

Contention: a parallel region ends only when its slowest thread does, and OpenMP threads spin-wait
between regions. On a loaded machine a thread that lost its core waits out another process's time
slice, so one busy process elsewhere (a compiler, say) turned 0.3 ms calls into 8 ms ones (32 ms for
eager RMSNorm, four regions per call) in measurements on a 2-core host, where back-to-back loops such
as `torch.utils.benchmark`'s barely moved. Under Linux's per-session autogroups a `nice` inside another
session does not help. `CpuTimer` counts, per timed window, the times the scheduler took a core from
this process (involuntary context switches); `contention()` says how many windows that happened in.

Memory: `setup` fixes glibc's malloc thresholds (`_keep_freed_memory`), so the harness's fresh input
copies do not make timed calls pay page faults that the same call in a loop never pays.

Cache flush: last-level caches protect lines that were used more than once from a stream of lines written
once (scan resistance). After one pass writing 64 MiB (the flush until 2026-11-24) a 4 MiB input read twice
just before it was partly still in the 32 MiB L3 (AMD EPYC, Zen 5): an RMSNorm call ran 18-22% faster than
after the same flush of an input read once, and torch.utils.benchmark's `timeit(1)`, which makes two untimed
calls before each timed one, read 6-12% lower than KForge's loop (bench/explore/cpu_call_gap.py). So a "cold"
time depended on what ran before the flush. `flush_cache` now writes each chunk of a larger buffer twice in
a row: the second write hits, the flush's own lines become the re-used ones and push the rest out, and the
same loops agree within 2% (all of them colder than before: 0.38 ms where the old flush gave 0.24-0.30).
Twice the LLCs written twice was not enough either: in 2 of 5 processes on the same VM (placement-dependent)
a 4 MiB input read twice before it still ran 14-22% faster after it (a CI failure on 2026-11-24), and the
buffer's first write alone, even at four times the LLC, left 0.58-0.85. Four times the LLCs, each chunk written
twice, gave 0.99-1.01 in every process tried (bench/explore/cpu_flush_size.py; flush 3.5 ms for 128 MiB).
"""

from __future__ import annotations

import math
import os
import platform
import re
import resource
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .host import WallTimer, cpu_name, llc_bytes, llc_layout, measure_cpu_ceilings
from .base import Availability, BackendBase, DeviceFacts
from .build.compiler_report import VEC_REPORT_FILE

__all__ = ["VEC_REPORT_FILE", "CpuBackend", "CpuTimer", "flush_plan", "llc_layout", "openmp_runtimes", "threads_wanted",
           "usable_cpus", "vectorizer_flags"]


# Share of timed windows in which another process took a core from the timed call, above which the
# timings say more about the machine's load than about the kernel.
_CONTENDED_FRACTION = 0.25
# OpenMP runtimes by file name: GNU (libgomp, also under auditwheel's hashed names), LLVM (libomp), Intel (libiomp5).
_OPENMP_RUNTIME = re.compile(r"^lib(gomp|omp|iomp5)([-.][^/]*)?\.so(\.[0-9.]+)?$")


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota (a container's --cpus)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_cpu_quota()
    # More threads than the quota allows are throttled in turn, and a parallel region waits for the last.
    return max(1, min(cpus, math.floor(quota))) if quota else cpus


def _cgroup_cpu_quota() -> float | None:
    """CPUs' worth of time the cgroup may use per period (cgroup v2 cpu.max or v1 cfs quota), or None."""
    for path in ("/sys/fs/cgroup/cpu.max",):
        try:
            quota, period = Path(path).read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        except (OSError, ValueError):
            pass
    for base in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
        try:
            quota = int(Path(base, "cpu.cfs_quota_us").read_text())
            period = int(Path(base, "cpu.cfs_period_us").read_text())
            return quota / period if quota > 0 and period > 0 else None
        except (OSError, ValueError):
            pass
    return None


def threads_wanted() -> int:
    """The team size timed calls get: OMP_NUM_THREADS when the operator set it, else every usable CPU."""
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        n = 0
    return n if n > 0 else usable_cpus()


def openmp_runtimes() -> dict[str, int]:
    """Each OpenMP runtime loaded in this process, with the team size a parallel region started on the
    calling thread would get from it (`omp_get_max_threads`). Linux only (reads /proc/self/maps)."""
    import ctypes

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return {}
    mapped = {fields[5] for fields in (line.split(maxsplit=5) for line in maps.splitlines()) if len(fields) == 6}
    found = {}
    for path in sorted(p for p in mapped if _OPENMP_RUNTIME.match(os.path.basename(p))):
        try:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LOCAL)
            found[path] = int(lib.omp_get_max_threads())
        except (OSError, AttributeError):
            continue  # unloaded meanwhile, or not a runtime after all
    return found


def _keep_freed_memory() -> None:
    """Let glibc's malloc keep freed memory mapped, so a timed call's output lands on pages already touched.

    Each timed call gets fresh input copies and frees them with its output afterwards. That pattern
    made glibc return the top of its heap to the OS (its trim threshold follows the largest block
    freed so far) and map it again inside the next timed call: 512-1024 page faults per call, 0.3-0.8 ms
    on a 0.3 ms RMSNorm, in timings that calls back to back on one input (torch.utils.benchmark) never
    paid. Fixed thresholds keep blocks below 32 MiB (glibc's ceiling for mmap_threshold) on the heap and
    keep the heap's freed top. Blocks above it are mapped per call, inside KForge and outside alike.
    """
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return  # not glibc (musl, macOS): nothing to tune
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 * 2**20)
    mallopt(m_trim_threshold, 1 << 30)


def _involuntary_switches() -> int:
    """Times the scheduler took a core from any thread of this process (getrusage, about 1 us)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


class CpuTimer(WallTimer):
    """The wall-clock window, plus the involuntary context switches that happened inside it.

    The switch counts are read just outside the window, so they cost the timed call nothing.
    """

    def __init__(self, tally: list[int] | None = None) -> None:
        super().__init__()
        self._tally = tally  # [windows, preempted windows], kept by the backend
        self._cs0 = self.preemptions = 0

    def start(self) -> None:
        self._cs0 = _involuntary_switches()
        super().start()

    def stop(self) -> None:
        super().stop()
        self.preemptions = _involuntary_switches() - self._cs0
        if self._tally is not None:
            self._tally[0] += 1
            self._tally[1] += self.preemptions > 0

# The flush buffer: at least this large, and at least four times all the last-level caches of the usable CPUs.
_FLUSH_MIN_BYTES = 128 * 2**20
_FLUSH_LLC_MULTIPLE = 4
_FLUSH_MAX_BYTES = 2**30
# At most this many chunks: each write of a chunk is a parallel region, and on a busy host each region may wait
# out another process's time slice (8 MiB chunks, 16 regions, made a flush take 390 ms on the loaded 2-core VM).
_FLUSH_MAX_CHUNKS = 8


def flush_plan() -> tuple[int, int]:
    """(buffer bytes, chunk bytes) of `CpuBackend.flush_cache` on this machine.

    A chunk is half of all the last-level caches (the threads spread it over them), so its second write hits;
    where those are small, chunks grow to an eighth of the buffer, which then outsizes the caches many times."""
    llc, count = llc_layout() or (32 * 2**20, 1)
    total = min(_FLUSH_MAX_BYTES, max(_FLUSH_MIN_BYTES, _FLUSH_LLC_MULTIPLE * llc * count))
    chunk = max(llc * count // 2, total // _FLUSH_MAX_CHUNKS) // 2**20 * 2**20
    return -(-total // chunk) * chunk, chunk


def vectorizer_flags() -> list[str]:
    """Flags that make the C++ compiler report which of the candidate's loops it vectorized and why not.

    They change no code, only add a report: GCC's goes to `VEC_REPORT_FILE`, clang's remarks to the build log.
    """
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if cxx is None:
        return []
    if cxx not in _VECTORIZER_FLAGS:
        try:
            out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=20).stdout.lower()
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        if "clang" in out:
            flags = ["-Rpass=loop-vectorize", "-Rpass-missed=loop-vectorize"]
        elif "free software foundation" in out or "gcc" in out or "g++" in out:
            flags = [f"-fopt-info-vec-optimized-missed={VEC_REPORT_FILE}"]
        else:
            flags = []
        _VECTORIZER_FLAGS[cxx] = flags
    return _VECTORIZER_FLAGS[cxx]


_VECTORIZER_FLAGS: dict[str, list[str]] = {}


def _first_line(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


class CpuBackend(BackendBase):
    name = "cpu"
    device = "cpu"
    kind = "cpu"
    limits_address_space = True

    def __init__(self) -> None:
        self._flush_buf = None
        self._windows = [0, 0]  # timed windows, and those another process preempted

    def probe(self) -> Availability:
        versions: dict[str, str] = {"python": platform.python_version()}
        try:
            import torch
            from torch.utils import cpp_extension
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
            return self.available(False, versions=versions,
                                reason=f"torch cannot be imported ({exc}); install torch (see README)")
        versions["torch"] = torch.__version__
        cxx = os.environ.get("CXX", "c++")
        cxx_path = shutil.which(cxx)
        if cxx_path is None:
            return self.available(False, versions=versions,
                                reason=f"no C++ compiler: '{cxx}' not found on PATH; install g++ or set CXX")
        versions["cxx"] = _first_line([cxx_path, "--version"]) or cxx_path
        try:
            cpp_extension.verify_ninja_availability()
        except RuntimeError:
            return self.available(False, versions=versions,
                                reason="ninja not found: `pip install ninja` (load_inline needs it)")
        versions["ninja"] = _first_line(["ninja", "--version"]) or "found"
        return self.available(True, versions=versions, hardware_profiler="perf",
                            device_name=cpu_name(),
                            reason=f"C++ compiler and ninja found; {os.cpu_count()} cores")

    def setup(self) -> None:
        import torch

        # No GPU for a CPU worker, before anything in it starts CUDA: on a GPU host torch's profiler (asked for
        # CPU activities only) and torch.cuda.is_available() started the driver and a context in every cpu-kind
        # worker, 1.15 GB of device memory each beside the GPU jobs (H100, 2026-11-24).
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        n = threads_wanted()
        # One team size for every OpenMP runtime: torch's own (loaded already) is told through
        # set_num_threads; a runtime a candidate's library brings in later reads OMP_NUM_THREADS when it
        # loads, where it would otherwise take every CPU of the host, whatever torch was told.
        os.environ["OMP_NUM_THREADS"] = str(n)
        torch.set_num_threads(n)
        _keep_freed_memory()

    def threads(self) -> int:
        """The team size of the timed calls: torch's intra-op threads, which every loaded OpenMP runtime
        also gives a candidate's parallel region (see `thread_warning` for when one does not)."""
        import torch

        return torch.get_num_threads()

    def thread_warning(self) -> str | None:
        """Why a timed call may not get `threads()` threads (a runtime that disagrees), or None."""
        want = self.threads()
        other = {p: n for p, n in openmp_runtimes().items() if n != want}
        if not other:
            return None
        return ("OpenMP runtimes in the worker give different team sizes than torch's "
                f"{want} threads: " + ", ".join(f"{os.path.basename(p)}: {n}" for p, n in sorted(other.items()))
                + "; a candidate that calls omp_set_num_threads or links its own OpenMP runtime changes its thread count")

    def to_device(self, value: Any) -> Any:
        return value  # inputs are made on the CPU already

    def timer(self) -> CpuTimer:
        return CpuTimer(self._windows)

    def contention(self, reset: bool = True) -> dict[str, Any]:
        """How many timed windows (since the last reset) another process preempted, and a warning when
        that share says the machine was too busy for the numbers to describe the kernel."""
        windows, preempted = self._windows
        if reset:
            self._windows[:] = [0, 0]
        share = preempted / windows if windows else 0.0
        warning = None
        if windows and share > _CONTENDED_FRACTION:
            warning = (f"other processes took a CPU from {preempted} of {windows} timed calls ({100 * share:.0f}%): "
                       "the machine was busy (compiles, other jobs) and the times are inflated; time again when it is idle")
        return {"windows": windows, "preempted": preempted, "warning": warning}

    def flush_cache(self) -> None:
        """Evict what earlier calls left in the caches, whatever they did with it (see the module's docstring)."""
        import torch

        if self._flush_buf is None:
            total, chunk = flush_plan()
            self._flush_buf = torch.empty(total // 4, dtype=torch.float32).split(chunk // 4)
        for part in self._flush_buf:
            part.fill_(1.0)
            part.fill_(2.0)  # hits in the cache: these lines are now the re-used ones, and they outrank the rest

    def facts(self) -> DeviceFacts:
        return DeviceFacts(backend=self.name, device_name=cpu_name(), kind=self.kind,
                           cores=len(os.sched_getaffinity(0)), cache_bytes=llc_bytes())

    def measure_ceilings(self) -> dict[str, Any]:
        return measure_cpu_ceilings()

    def build_defaults(self) -> dict[str, list[str]]:
        return {"extra_cflags": ["-O3", "-fopenmp", *vectorizer_flags()], "extra_ldflags": ["-fopenmp"]}

