"""Build capture for NVRTC: the `torch.cuda._compile_kernel` stand-in the cuda backend installs while user code
imports (runs in workers only)."""

from __future__ import annotations

import time
from typing import Any

from .diagnostics import parse_compiler_output
from .inline import BuildError, InlineBuilder
from .models import BuildInfo, KernelResources

__all__ = ["NvrtcBuilder"]


class NvrtcBuilder:
    """The `torch.cuda._compile_kernel` stand-in: NVRTC builds a raw kernel in well under a second.

    Records each kernel as a build (with the driver's register, shared and local memory figures) and
    turns NVRTC's log into diagnostics located in the candidate.
    """

    def __init__(self, original: Any, inline: InlineBuilder) -> None:
        self.original, self.inline = original, inline

    def __call__(self, kernel_source: str, kernel_name: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            kernel = self.original(kernel_source, kernel_name, *args, **kwargs)
        except RuntimeError as exc:
            log = str(exc)
            self.inline.source_map.add_source(f"{kernel_name}.cu", kernel_source, [kernel_source])
            diags = parse_compiler_output(log, self.inline.source_map, build_dir=None, source="cuda")
            self.inline.builds.append(BuildInfo(name=kernel_name, ok=False, seconds=time.perf_counter() - t0,
                                                from_cache=False, functions=[kernel_name], fast_paths=["NVRTC"]))
            self.inline.diagnostics.extend(diags)
            raise BuildError(kernel_name, diags, log) from exc
        self.inline.builds.append(BuildInfo(name=kernel_name, ok=True, seconds=time.perf_counter() - t0, from_cache=False,
                                            functions=[kernel_name], fast_paths=["NVRTC"],
                                            kernels=[_driver_resources(kernel, kernel_name)]))
        return kernel


def _driver_resources(kernel: Any, name: str) -> KernelResources:
    """Registers, static shared and local memory of a loaded kernel, from the driver (cuFuncGetAttribute)."""
    import ctypes

    values: dict[str, int | None] = {"registers": None, "shared_bytes": None, "local_bytes": None}
    arch = None
    try:
        import torch

        arch = "sm_{}{}".format(*torch.cuda.get_device_capability())  # torch compiles NVRTC kernels for it
        libcuda = torch.cuda._utils._get_gpu_runtime_library()
        for field_name, attribute in (("registers", 4), ("shared_bytes", 1), ("local_bytes", 3)):
            out = ctypes.c_int()
            if libcuda.cuFuncGetAttribute(ctypes.byref(out), attribute, kernel.func) == 0:
                values[field_name] = out.value
    except Exception:  # noqa: BLE001 - figures are a bonus; the kernel itself is fine
        pass
    return KernelResources(kernel=name, arch=arch, **values)
