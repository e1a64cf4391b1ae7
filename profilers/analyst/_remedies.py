"""Remedy texts as data: what to change for each bottleneck, per backend family ('cpu' or 'gpu').

The rules pick a text by (family, bottleneck); adding a backend family or rewording advice is an
edit here, not a new branch in the rules.
"""

from __future__ import annotations

import functools
import re

from kforge.backends import backend_class
from kforge.profilers.report import ProfileReport

__all__ = ["MATMUL_REMEDIES", "REMEDIES", "REMEDY_TITLES", "SLOWER_THAN_EAGER", "family_of", "is_matmul_like"]

REMEDIES: dict[str, dict[str, str]] = {
    "cpu": {
        "memory-bound": "Cut memory traffic: fuse passes so each element is loaded once, block loops so the working "
                        "set fits in L1/L2, and keep the inner loop unit-stride over contiguous memory.",
        "memory-bound:at-ceiling": "The kernel streams memory at close to the machine's measured bandwidth: it gets "
                                   "faster only by moving fewer bytes. Do the work of the ops before and after it in the "
                                   "same pass, read each input once, and use a narrower dtype where the precision policy "
                                   "allows.",
        "compute-bound": "Vectorize the contiguous inner loop (`#pragma omp simd`, compile with -O3 -march=native), "
                         "parallelize the outer loop with `#pragma omp parallel for`, and hoist invariant work out "
                         "of the inner loop.",
        "latency-bound": "Break dependency chains (several independent accumulators), move branches out of the "
                         "inner loop, and parallelize the outer loop with `#pragma omp parallel for`.",
        "launch-bound": "Fuse the small ops into one C++ loop over the data, so the per-op dispatch cost "
                        "(a few us each) is paid once per call instead of once per op.",
        "framework-bound": "Write the loops yourself in the extension instead of calling at:: / torch ops, so the "
                           "work runs in your kernel rather than in framework ops.",
        "host-bound": "Move Python-side work (shape checks, allocations, .contiguous(), dtype casts) out of the "
                      "per-call path, e.g. into __init__.",
        "unknown": "Parallelize the outer loop with `#pragma omp parallel for` and vectorize the contiguous inner "
                   "loop with `#pragma omp simd`.",
    },
    "gpu": {
        "memory-bound": "Coalesce global accesses (consecutive threads touch consecutive addresses), use vectorized "
                        "128-bit loads (float4), and fuse neighbouring elementwise ops so data crosses DRAM once.",
        "memory-bound:uncoalesced": "Make global accesses coalesced: map consecutive threads (threadIdx.x, or the "
                                    "contiguous axis of a Triton block) to consecutive addresses of the array that is "
                                    "read with a stride, and where the data must be read in another order (a transpose, "
                                    "a column walk), stage a tile through shared memory: load it coalesced, "
                                    "__syncthreads(), read it transposed (pad the tile by one column against bank conflicts).",
        "memory-bound:cache": "Reuse data from registers and shared memory instead of re-reading it through L1/L2: tile "
                              "the loops so each block loads its inputs once into shared memory and each thread "
                              "computes several outputs from registers.",
        "memory-bound:at-ceiling": "The kernel streams memory at close to the device's bandwidth: it gets faster only by "
                                   "moving fewer bytes. Fuse it with the ops before and after it so intermediates never "
                                   "reach DRAM, read each input once, and use a narrower dtype where the precision "
                                   "policy allows.",
        "launch-bound:tiny-kernels": "Do more work per launch: fuse consecutive kernels into one, loop inside the kernel "
                                     "instead of launching it repeatedly, or capture the sequence in a CUDA graph "
                                     "(torch.cuda.CUDAGraph) so the host launches it once.",
        "compute-bound": "Use tensor cores (WMMA / mma.sync, tl.dot in Triton) or a lower precision the tolerance "
                         "allows, remove redundant arithmetic, and use fast intrinsics (__expf, rsqrtf).",
        "latency-bound": "Raise occupancy (enough blocks for several waves over the SMs, fewer registers or less "
                         "shared memory per block) and give each thread more independent work (ILP).",
        "launch-bound": "Fuse the kernels into one launch (or capture the sequence in a CUDA graph); each launch "
                        "costs about 5 us of host time whatever its size.",
        "framework-bound": "Move the remaining aten ops into your kernel so they run inside your launch instead of "
                           "as separate framework kernels.",
        "host-bound": "Remove host-side work between launches (allocations, .item()/.cpu() syncs, Python "
                      "loops); the GPU waits on the host.",
        "unknown": "Profile the kernel with Nsight Compute (ncu --set full) and paste its details to learn "
                   "whether it is memory- or compute-bound.",
    },
}

# Extra advice when the hot op is a matmul/convolution, where tiling decides the speed.
MATMUL_REMEDIES: dict[str, str] = {
    "cpu": "For the matmul-like op: block the loops into tiles that fit in cache (e.g. 64x64), order them i-k-j so "
           "the inner loop runs over contiguous memory, and vectorize that loop.",
    "gpu": "For the matmul-like op: tile through shared memory (each block loads A and B tiles once) and use "
           "tensor cores (WMMA / mma.sync, or tl.dot in Triton) for the inner product.",
}

REMEDY_TITLES: dict[str, str] = {
    "memory-bound": "Cut memory traffic in the hot kernel",
    "memory-bound:uncoalesced": "Coalesce the hot kernel's global accesses",
    "memory-bound:cache": "Reuse data in registers and shared memory",
    "launch-bound:tiny-kernels": "Do more work per launch",
    "memory-bound:at-ceiling": "Move fewer bytes: the kernel is at the bandwidth ceiling",
    "compute-bound": "Speed up the arithmetic in the hot kernel",
    "latency-bound": "Expose more parallelism in the hot kernel",
    "unknown": "Tune the hot kernel",
}

# What to try when the candidate is slower than eager PyTorch, by the bottleneck found.
SLOWER_THAN_EAGER: dict[str, str] = {
    "framework-bound": "Eager already runs these same framework kernels, so wrapping them only adds overhead: "
                       "replace them with one kernel of your own that does the whole computation.",
    "launch-bound": "Eager pays per-op overhead too; fuse your ops into one kernel so you pay it once.",
    "host-bound": "Remove the host-side work between kernels first; eager keeps the device busier.",
    "memory-bound": "Eager's kernels already stream memory well: fuse passes and vectorize loads so your kernel "
                    "moves fewer bytes than eager's sequence of kernels.",
    "compute-bound": "Eager calls tuned libraries (oneDNN/MKL, cuBLAS/cuDNN): tile and vectorize, or keep the "
                     "library call for the matmul part and fuse the work around it.",
    "latency-bound": "Eager's kernels use every core / SM: check that your kernel is parallel over the outer "
                     "dimension and has enough independent work per thread.",
    "unknown": "Check first that your kernel is parallel (all cores or enough GPU blocks) and reads memory "
               "contiguously; eager's kernels do both.",
}

_MATMUL_LIKE = re.compile(r"mm|matmul|conv|linear", re.IGNORECASE)


def is_matmul_like(op_name: str) -> bool:
    """'aten::addmm', 'aten::conv2d', 'kforge::ext.matmul_tiled' -> True."""
    return bool(_MATMUL_LIKE.search(op_name.rsplit("::", 1)[-1]))


def family_of(report: ProfileReport) -> str:
    """'gpu' or 'cpu': which remedies fit the profiled device.

    The device's own kind where the report carries it (`DeviceFacts.kind`); else 'gpu' when any op took device
    time; else the kind its backend declares (`Backend.kind`, read from the registered class), 'cpu' for a name
    no backend here has."""
    if report.device is not None and report.device.kind is not None:
        return report.device.kind
    if any(r.device_time_us for r in report.ops):
        return "gpu"
    return _declared_kind(report.backend.lower())


@functools.lru_cache(maxsize=32)
def _declared_kind(backend: str) -> str:
    try:
        return "gpu" if getattr(backend_class(backend), "kind", "cpu") == "gpu" else "cpu"
    except Exception:  # noqa: BLE001 - unknown here (a profile parsed from text, a plug-in not installed)
        return "cpu"
