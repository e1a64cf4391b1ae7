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

from .host import WallTimer, cpu_name, measure_cpu_ceilings
from ._nvidia import (EventTimer, GpuClock, L2Flusher, LaunchProbe, NvidiaGpu, gpu_facts, gpu_memory_capacity, list_gpus,
                      measure_gpu_ceilings, preload_gpu_compiler, setup_gpu, strict_gpu_numerics, warm_gpu_libraries)
from .base import Availability, BackendBase, DeviceFacts
from .build.models import Diagnostic

__all__ = ["TritonBackend"]


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


class TritonBackend(NvidiaGpu, BackendBase):
    name = "triton"
    kind = "gpu"  # without a GPU, an instance says "cpu": the interpreter runs on host tensors
    worker_env_names = NvidiaGpu.worker_env_names + ("TRITON_INTERPRET",)  # the interpreter where no GPU is
    kernel_modules = ("triton",)

    def __init__(self) -> None:
        self._gpu = _has_gpu()
        self.device = "cuda" if self._gpu else "cpu"
        self.kind = "gpu" if self._gpu else "cpu"
        self._flush = L2Flusher()
        # read between timed batches (tools/harness/timing.py); none in the interpreter, where nothing is launched
        self.launch_cost_us = LaunchProbe() if self._gpu else None
        self._clock: GpuClock | None = None  # made at its first read: constructing a backend starts no device

    def probe(self) -> Availability:
        versions: dict[str, str] = {"python": platform.python_version()}
        try:
            import torch
        except Exception as exc:  # noqa: BLE001
            return self.available(False, versions=versions, reason=f"torch cannot be imported ({exc})")
        versions["torch"] = torch.__version__
        try:
            import triton
        except Exception as exc:  # noqa: BLE001
            return self.available(False, versions=versions,
                                reason=f"triton cannot be imported ({exc}); `pip install triton`"
                                       + ("" if self._gpu else " (without an NVIDIA GPU it runs under its interpreter: "
                                                               "verified, not timed)"))
        versions["triton"] = triton.__version__
        if self._gpu:
            return self.available(True, versions=versions, device_name=torch.cuda.get_device_name(0),
                                hardware_profiler="ncu", gpus=list_gpus(),
                                reason="GPU present: kernels are JIT-compiled by Triton and timed")
        try:  # the interpreter has needs of its own (numpy) that `import triton` does not reveal
            import triton.runtime.interpreter  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            return self.available(False, versions=versions,
                                reason=f"no GPU, and Triton's interpreter (which runs Triton candidates without one) "
                                       f"cannot load: {exc}; `pip install numpy` (timing Triton kernels needs an NVIDIA GPU)")
        return self.available(True, timing=False, mode="interpreter", versions=versions, sync_launch_env={},
                            device_name=cpu_name(),
                            reason="no GPU: candidates run under Triton's interpreter (TRITON_INTERPRET=1) on CPU "
                                   "tensors; results are verified, not timed")

    def setup(self) -> None:
        if not self._gpu:
            # Must be set before the candidate imports triton: @triton.jit reads it at decoration.
            os.environ["TRITON_INTERPRET"] = "1"
            return
        setup_gpu()

    def synchronize(self) -> None:
        if self._gpu:
            import torch

            torch.cuda.synchronize()

    def timer(self) -> EventTimer | WallTimer:
        return EventTimer() if self._gpu else WallTimer()

    def flush_cache(self) -> None:
        if self._gpu:
            self._flush()

    def clock_state(self) -> tuple[float, tuple[str, ...]] | None:
        """The GPU's SM clock and active slowdown reasons now (`GpuClock`), None where NVML cannot tell."""
        if not self._gpu:
            return None
        if self._clock is None:
            self._clock = GpuClock()
        return self._clock.read()

    def facts(self) -> DeviceFacts:
        # Under the interpreter no kind: the kernels are written for a GPU, and advice on them stays GPU advice.
        return gpu_facts(self.name) if self._gpu else DeviceFacts(backend=self.name, device_name=cpu_name())

    def measure_ceilings(self) -> dict[str, Any]:
        return measure_gpu_ceilings() if self._gpu else measure_cpu_ceilings()

    def strict_numerics(self) -> None:
        strict_gpu_numerics()

    @classmethod
    def preload(cls) -> dict[str, float]:
        return {**super().preload(), **preload_gpu_compiler()}

    def warm_libraries(self) -> None:
        if self._gpu:
            warm_gpu_libraries(self.device)

    def memory_capacity(self) -> int:
        return gpu_memory_capacity(self.device) if self._gpu else super().memory_capacity()

    def compile_error(self, exc: BaseException, user_text: str) -> Diagnostic | None:
        """Triton's CompilationError (at a kernel's first launch, or at import), located in the candidate: its
        `src` starts at the kernel's `def` line, its `node` is the offending expression."""
        err = _triton_compile_error(exc)
        if err is None:
            return None
        src, node = getattr(err, "src", None), getattr(err, "node", None)
        line = None
        if src and node is not None and getattr(node, "lineno", None):
            first = src.splitlines()[0].strip()
            hits = [i for i, l in enumerate(user_text.splitlines(), 1) if l.strip() == first]
            if len(hits) == 1:
                line = hits[0] + node.lineno - 1
        message = (getattr(err, "error_message", None) or str(err).splitlines()[-1]).strip()
        code_lines = user_text.splitlines()
        code_line = code_lines[line - 1].rstrip() if line and 0 < line <= len(code_lines) else None
        return Diagnostic(severity="error", message=message, line=line, column=getattr(node, "col_offset", None),
                          source="triton", code_line=code_line)

    def profiler_activities(self) -> list[Any]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if self._gpu else [ProfilerActivity.CPU]

    def jit_kernels(self, module: Any) -> list[dict[str, Any]]:
        if not self._gpu:
            return []  # the interpreter compiles nothing
        seen: dict[str, dict[str, Any]] = {}
        for obj in vars(module).values():
            for compiled in _compiled_kernels(obj):
                info = _resources(compiled)
                seen[f"{info['kernel']}:{info['num_warps']}:{info['num_stages']}"] = info
        return list(seen.values())


def _triton_compile_error(exc: BaseException | None) -> Any:
    """The Triton CompilationError in `exc`'s chain, if any (matched by name: triton may be absent)."""
    seen = 0
    while exc is not None and seen < 10:
        if type(exc).__name__ == "CompilationError" and type(exc).__module__.startswith("triton"):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _compiled_kernels(obj: Any) -> list[Any]:
    """CompiledKernels behind a JITFunction, unwrapping autotuners and heuristics (`.fn`)."""
    for _ in range(4):  # @autotune(@heuristics(@jit)) nests a few levels at most
        if not type(obj).__module__.startswith("triton"):
            return []
        if hasattr(obj, "device_caches"):
            break
        obj = getattr(obj, "fn", None)
    else:
        return []
    # device_caches[device] is a tuple whose first item is {specialization key: CompiledKernel}.
    return [k for entry in getattr(obj, "device_caches", {}).values() for k in entry[0].values()]


def _resources(kernel: Any) -> dict[str, Any]:
    meta = kernel.metadata
    kernel._init_handles()  # loads the binary if no launch has yet; sets n_regs and n_spills
    target = getattr(meta, "target", None)
    return {"kernel": kernel.name, "registers": getattr(kernel, "n_regs", None),
            "shared_bytes": getattr(meta, "shared", None),
            # Triton's n_spills is CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES / 4: local memory, i.e. spills.
            "local_bytes": 4 * kernel.n_spills if getattr(kernel, "n_spills", None) is not None else None,
            "arch": f"sm_{target.arch}" if target is not None else None,
            "num_warps": getattr(meta, "num_warps", None), "num_stages": getattr(meta, "num_stages", None)}
