"""CUDA backend: CUDA C++ built with `torch.utils.cpp_extension.load_inline`, on NVIDIA GPUs.

Builds target only the GPU that is present (TORCH_CUDA_ARCH_LIST is pinned to its compute
capability) and ask ptxas for its resource report (`-Xptxas -v`), which `kforge.tools` turns into
registers, shared memory, spills and stack per kernel. TF32 is switched off so a fp32 reference
is computed in fp32.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Any, Iterator

from ._nvidia import (EventTimer, GpuClock, L2Flusher, LaunchProbe, NvidiaGpu, gpu_facts, gpu_memory_capacity, list_gpus,
                      measure_gpu_ceilings, nvidia_gpu_present, preload_gpu_compiler, setup_gpu, strict_gpu_numerics, warm_gpu_libraries)
from .base import Availability, BackendBase, DeviceFacts

__all__ = ["CudaBackend"]

def _nvcc_version(nvcc: str) -> str | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [l for l in out.splitlines() if "release" in l]
    return lines[0].strip() if lines else None


class CudaBackend(NvidiaGpu, BackendBase):
    name = "cuda"
    device = "cuda"
    kind = "gpu"

    def __init__(self) -> None:
        self._flush = L2Flusher()
        self.launch_cost_us = LaunchProbe()  # read between timed batches (tools/harness/timing.py)
        self._clock: GpuClock | None = None  # made at its first read: constructing a backend starts no device

    def probe(self) -> Availability:
        versions: dict[str, str] = {"python": platform.python_version()}
        try:
            import torch
            from torch.utils import cpp_extension
        except Exception as exc:  # noqa: BLE001
            return self.available(False, versions=versions,
                                reason=f"torch cannot be imported ({exc})")
        versions["torch"] = torch.__version__
        if torch.version.cuda is None:
            # Advice that fits the host: a CUDA build of torch helps only where there is a GPU to run it.
            reason = ("torch is a CPU-only build and this host has an NVIDIA GPU: install a CUDA build of torch "
                      "(`pip install torch`)" if nvidia_gpu_present() else
                      "no NVIDIA GPU on this host: the cuda backend needs one")
            return self.available(False, versions=versions, reason=reason)
        versions["torch_cuda"] = torch.version.cuda
        if not torch.cuda.is_available():
            return self.available(False, versions=versions,
                                reason="torch.cuda.is_available() is False although this host has an NVIDIA GPU: check "
                                       "the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES" if nvidia_gpu_present() else
                                       "no NVIDIA GPU on this host: the cuda backend needs one")
        home = cpp_extension.CUDA_HOME
        nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
        if not nvcc or not os.path.exists(nvcc):
            return self.available(False, versions=versions,
                                reason="nvcc not found (set CUDA_HOME or put nvcc on PATH)")
        versions["nvcc"] = _nvcc_version(nvcc) or nvcc
        try:
            cpp_extension.verify_ninja_availability()
        except RuntimeError:
            return self.available(False, versions=versions,
                                reason="ninja not found: `pip install ninja` (load_inline needs it)")
        major, minor = torch.cuda.get_device_capability(0)
        name = torch.cuda.get_device_name(0)
        versions["compute_capability"] = f"{major}.{minor}"
        return self.available(True, versions=versions, device_name=name, hardware_profiler="ncu",
                            reason=f"{torch.cuda.device_count()} GPU(s); builds for sm_{major}{minor}", gpus=list_gpus())

    def setup(self) -> None:
        import torch

        setup_gpu()
        major, minor = torch.cuda.get_device_capability(0)
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"  # build only for the GPU present

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def timer(self) -> EventTimer:
        return EventTimer()

    def flush_cache(self) -> None:
        self._flush()

    def clock_state(self) -> tuple[float, tuple[str, ...]] | None:
        """The GPU's SM clock and active slowdown reasons now (`GpuClock`), None where NVML cannot tell."""
        if self._clock is None:
            self._clock = GpuClock()
        return self._clock.read()

    def facts(self) -> DeviceFacts:
        return gpu_facts(self.name)

    def measure_ceilings(self) -> dict[str, Any]:
        return measure_gpu_ceilings()

    def build_defaults(self) -> dict[str, list[str]]:
        return {"extra_cflags": ["-O3"], "extra_cuda_cflags": ["-O3", "-Xptxas=-v"]}

    def profiler_activities(self) -> list[Any]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]

    @contextlib.contextmanager
    def capture_builds(self, builder: Any) -> Iterator[None]:
        """`load_inline` builds, and raw kernels built by NVRTC through `torch.cuda._compile_kernel`."""
        from .build.nvrtc import NvrtcBuilder

        cuda = sys.modules.get("torch.cuda")
        nvrtc = getattr(cuda, "_compile_kernel", None)
        with super().capture_builds(builder):
            if nvrtc is not None:
                cuda._compile_kernel = NvrtcBuilder(nvrtc, builder)
            try:
                yield
            finally:
                if nvrtc is not None:
                    cuda._compile_kernel = nvrtc

    def strict_numerics(self) -> None:
        strict_gpu_numerics()

    @classmethod
    def preload(cls) -> dict[str, float]:
        from .build.fast_build import toolchain_id

        parts = super().preload()
        started = time.perf_counter()
        toolchain_id(True)  # nvcc's identity too: CUDA sources are this backend's builds
        parts["nvcc toolchain id"] = round(time.perf_counter() - started, 3)
        return {**parts, **preload_gpu_compiler()}

    def warm_libraries(self) -> None:
        warm_gpu_libraries(self.device)

    def memory_capacity(self) -> int:
        return gpu_memory_capacity(self.device)
