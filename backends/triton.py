"""Triton backend: candidates with `@triton.jit` kernels.

On a host with an NVIDIA GPU, kernels are JIT-compiled and timed like CUDA ones (device events,
cold L2). Without a GPU the backend still verifies candidates by running them under Triton's
interpreter (`TRITON_INTERPRET=1`) on CPU tensors; it then reports `timing=False`, so no timing is
claimed.
"""

from __future__ import annotations

import os
import platform
from typing import Any

from ._host import WallTimer, cpu_name, measure_cpu_ceilings
from ._nvidia import EventTimer, L2Flusher, gpu_facts, measure_gpu_ceilings, setup_gpu
from .base import Availability, DeviceFacts, map_structure

__all__ = ["TritonBackend"]


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


class TritonBackend:
    name = "triton"
    limits_address_space = False  # on a GPU host the CUDA driver reserves huge virtual ranges

    def __init__(self) -> None:
        self._gpu = _has_gpu()
        self.device = "cuda" if self._gpu else "cpu"
        self._flush = L2Flusher()

    def probe(self) -> Availability:
        versions: dict[str, str] = {"python": platform.python_version()}
        try:
            import torch
        except Exception as exc:  # noqa: BLE001
            return Availability(backend=self.name, ok=False, versions=versions, reason=f"torch cannot be imported ({exc})")
        versions["torch"] = torch.__version__
        try:
            import triton
        except Exception as exc:  # noqa: BLE001
            return Availability(backend=self.name, ok=False, versions=versions,
                                reason=f"triton cannot be imported ({exc}); `pip install triton`")
        versions["triton"] = triton.__version__
        if self._gpu:
            return Availability(backend=self.name, ok=True, versions=versions, device_name=torch.cuda.get_device_name(0),
                                hardware_profiler="ncu",
                                reason="GPU present: kernels are JIT-compiled by Triton and timed")
        return Availability(backend=self.name, ok=True, timing=False, mode="interpreter", versions=versions,
                            device_name=cpu_name(),
                            reason="no GPU: candidates run under Triton's interpreter (TRITON_INTERPRET=1) on CPU "
                                   "tensors; results are verified, not timed")

    def setup(self) -> None:
        if not self._gpu:
            # Must be set before the candidate imports triton: @triton.jit reads it at decoration.
            os.environ["TRITON_INTERPRET"] = "1"
            return
        setup_gpu()

    def to_device(self, value: Any) -> Any:
        return map_structure(lambda v: v.to(self.device) if hasattr(v, "to") else v, value)

    def synchronize(self) -> None:
        if self._gpu:
            import torch

            torch.cuda.synchronize()

    def timer(self) -> EventTimer | WallTimer:
        return EventTimer() if self._gpu else WallTimer()

    def flush_cache(self) -> None:
        if self._gpu:
            self._flush()

    def facts(self) -> DeviceFacts:
        return gpu_facts(self.name) if self._gpu else DeviceFacts(backend=self.name, device_name=cpu_name())

    def measure_ceilings(self) -> dict[str, Any]:
        return measure_gpu_ceilings() if self._gpu else measure_cpu_ceilings()

    def build_defaults(self) -> dict[str, list[str]]:
        return {}

    def profiler_activities(self) -> list[Any]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if self._gpu else [ProfilerActivity.CPU]
