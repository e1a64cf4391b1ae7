"""CPU backend: C++ kernels built with `torch.utils.cpp_extension.load_inline` and OpenMP."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import Any

from ._host import WallTimer, cpu_name, llc_bytes, measure_cpu_ceilings
from .base import Availability, DeviceFacts

__all__ = ["CpuBackend"]

# Large enough to evict the last-level cache of common server CPUs (tens of MiB); see flush_cache.
_FLUSH_BYTES = 64 * 1024 * 1024


def _first_line(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


class CpuBackend:
    name = "cpu"
    device = "cpu"
    limits_address_space = True

    def __init__(self) -> None:
        self._flush_buf = None

    def probe(self) -> Availability:
        versions: dict[str, str] = {"python": platform.python_version()}
        try:
            import torch
            from torch.utils import cpp_extension
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
            return Availability(backend=self.name, ok=False, versions=versions,
                                reason=f"torch cannot be imported ({exc}); install torch (see README)")
        versions["torch"] = torch.__version__
        cxx = os.environ.get("CXX", "c++")
        cxx_path = shutil.which(cxx)
        if cxx_path is None:
            return Availability(backend=self.name, ok=False, versions=versions,
                                reason=f"no C++ compiler: '{cxx}' not found on PATH; install g++ or set CXX")
        versions["cxx"] = _first_line([cxx_path, "--version"]) or cxx_path
        try:
            cpp_extension.verify_ninja_availability()
        except RuntimeError:
            return Availability(backend=self.name, ok=False, versions=versions,
                                reason="ninja not found: `pip install ninja` (load_inline needs it)")
        versions["ninja"] = _first_line(["ninja", "--version"]) or "found"
        return Availability(backend=self.name, ok=True, versions=versions, hardware_profiler="perf",
                            device_name=cpu_name(),
                            reason=f"C++ compiler and ninja found; {os.cpu_count()} cores")

    def setup(self) -> None:
        import torch

        torch.set_num_threads(len(os.sched_getaffinity(0)))

    def to_device(self, value: Any) -> Any:
        return value  # inputs are made on the CPU already

    def synchronize(self) -> None:
        return None

    def timer(self) -> WallTimer:
        return WallTimer()

    def flush_cache(self) -> None:
        import torch

        if self._flush_buf is None:
            self._flush_buf = torch.empty(_FLUSH_BYTES // 4, dtype=torch.float32)
        # Writing the whole buffer evicts what the previous call left in the caches.
        self._flush_buf.fill_(1.0)

    def facts(self) -> DeviceFacts:
        return DeviceFacts(backend=self.name, device_name=cpu_name(),
                           cores=len(os.sched_getaffinity(0)), cache_bytes=llc_bytes())

    def measure_ceilings(self) -> dict[str, Any]:
        return measure_cpu_ceilings()

    def build_defaults(self) -> dict[str, list[str]]:
        return {"extra_cflags": ["-O3", "-fopenmp"], "extra_ldflags": ["-fopenmp"]}

    def profiler_activities(self) -> list[Any]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU]

    def jit_kernels(self, module: Any) -> list[dict[str, Any]]:
        return []  # load_inline builds everything at import; ptxas reports come with the build
