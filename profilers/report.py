"""The normalized profile: one model that every collector fills and every analyst reads.

Times are stored in microseconds (`_us`), as `torch.profiler` reports them; `format_us` picks
the unit for display only.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field

from kforge.backends.base import DeviceFacts

__all__ = ["Counter", "NcuKernel", "OpRow", "ProfileReport", "TimingStats", "format_us", "hottest_kernel",
           "kernel_base_name"]

# A spread (IQR / median) above this makes a timing noisy enough to warn about.
_IQR_WARN_FRACTION = 0.10
# Fewer samples than this and the median itself is shaky.
_MIN_SAMPLES = 10


def kernel_base_name(kernel: str) -> str:
    """'relu_kernel(float const*, float*, int)' -> 'relu_kernel'; 'void ns::k<4>(...)' -> 'ns::k'.

    Profilers and compilers spell one kernel differently (with or without parameters, return type,
    template arguments); the base name is what they agree on.
    """
    name = kernel.split("(", 1)[0].strip()
    name = name.split("<", 1)[0]
    return name.rsplit(" ", 1)[-1]


def format_us(us: float | None) -> str:
    if us is None or math.isnan(us):
        return "n/a"
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    if us >= 1e3:
        return f"{us / 1e3:.3f} ms"
    return f"{us:.2f} us"


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class TimingStats(BaseModel):
    """Statistics of repeated timed calls of one model, built once from the samples."""

    model_config = ConfigDict(frozen=True)

    label: str = Field(description="What was timed: 'candidate', 'eager', 'torch.compile'.")
    samples: int
    median_us: float
    mean_us: float
    std_us: float
    min_us: float
    max_us: float
    q1_us: float
    q3_us: float
    rel_sem: float = Field(description="Standard error of the mean divided by the mean.")
    host_median_us: float | None = Field(default=None, description="Median of the same calls on the host clock, "
                                         "closed after a device-wide sync; far above median_us means unseen work.")
    unseen_work: bool = Field(default=False, description="The host saw far more time than the device timer: work "
                              "ran on another stream or thread.")
    replay_suspected: bool = Field(default=False, description="Calls on inputs seen before were much faster than "
                                   "calls on new ones.")
    input_sets: int | None = Field(default=None, description="Distinct input sets the timed calls walked through.")
    warnings: tuple[str, ...] = ()

    @property
    def iqr_us(self) -> float:
        return self.q3_us - self.q1_us

    @classmethod
    def from_samples_s(cls, label: str, samples_s: Sequence[float], *, host_samples_s: Sequence[float] = (),
                       extra_warnings: Sequence[str] = (), **flags: Any) -> TimingStats:
        if not samples_s:
            raise ValueError(f"no timing samples for {label}")
        us = sorted(s * 1e6 for s in samples_s)
        n = len(us)
        mean = statistics.fmean(us)
        std = statistics.stdev(us) if n > 1 else 0.0
        median = statistics.median(us)
        q1, q3 = _quantile(us, 0.25), _quantile(us, 0.75)
        warnings = list(extra_warnings)
        if n < _MIN_SAMPLES:
            warnings.append(f"only {n} samples (fewer than {_MIN_SAMPLES}); the median is uncertain")
        if median > 0 and (q3 - q1) / median > _IQR_WARN_FRACTION:
            warnings.append(f"noisy: IQR is {100 * (q3 - q1) / median:.0f}% of the median")
        host_median = statistics.median(host_samples_s) * 1e6 if host_samples_s else None
        return cls(label=label, samples=n, median_us=median, mean_us=mean, std_us=std, min_us=us[0],
                   max_us=us[-1], q1_us=q1, q3_us=q3, host_median_us=host_median,
                   rel_sem=(std / math.sqrt(n) / mean) if mean > 0 else 0.0, warnings=tuple(warnings), **flags)

    def __str__(self) -> str:
        return (f"{self.label}: median {format_us(self.median_us)} "
                f"(IQR {format_us(self.q1_us)} to {format_us(self.q3_us)}, {self.samples} samples)")


class OpRow(BaseModel):
    """One line of a profiler's operator or kernel table."""

    model_config = ConfigDict(frozen=True)

    name: str
    calls: int
    self_time_us: float = Field(description="Time in this op itself, per profiled window.")
    total_time_us: float = Field(description="Time including the ops it called.")
    device_time_us: float | None = Field(default=None, description="Device (GPU) time, where recorded.")
    share: float = Field(description="self_time_us as a fraction of all ops' self time.")
    is_custom: bool = Field(description="True for the candidate's own compiled kernels.")


class Counter(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    value: float
    unit: str = ""


class Baseline(BaseModel):
    """A reference implementation timed beside the candidate (in this run, or reused: `reused_after_s`)."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="'eager' or 'torch.compile'.")
    timing: TimingStats | None = None
    speedup: float | None = Field(default=None, description="Baseline median / candidate median; >1 means the candidate is faster.")
    error: str | None = Field(default=None, description="Why this baseline could not be timed.")
    reused_after_s: float | None = Field(default=None, description=(
        "Set when this timing was taken by an earlier profile of the same reference on this device, with the "
        "same versions and budget, this many seconds ago (KForge re-times a baseline at most every 10 minutes); "
        "None: timed in this run."))


class NcuKernel(BaseModel):
    """Nsight Compute's view of one kernel launch, condensed to what decides the next change."""

    model_config = ConfigDict(frozen=True)

    name: str
    is_custom: bool
    metrics: dict[str, float] = Field(description="By ncu's display names (durations at ncu's locked base clocks, so "
                                      "longer than the timed median at running clocks): 'Duration [us]', 'Compute (SM) Throughput', "
                                      "'Memory Throughput', 'DRAM Throughput', 'Achieved Occupancy', ...")
    occupancy_limiter: str | None = Field(default=None, description="What limits blocks per SM: registers, shared memory, warps, blocks.")
    top_stalls: list[tuple[str, float]] = Field(default_factory=list, description="Warp stall reasons, cycles per issued instruction.")
    rules: list[dict[str, str]] = Field(default_factory=list, description="ncu's own rule findings: rule, title, message.")



def hottest_kernel(kernels: Sequence[NcuKernel]) -> NcuKernel | None:
    """The candidate's longest ncu-profiled launch (any launch when none is marked as the candidate's)."""
    own = [k for k in kernels if k.is_custom] or list(kernels)
    return max(own, key=lambda k: k.metrics.get("Duration [us]", 0.0), default=None)

class ProfileReport(BaseModel):
    """Everything the analyst reads about one profiled candidate."""

    model_config = ConfigDict(frozen=True)

    backend: str
    device_name: str
    collector: str = Field(description="Which profiler produced the op table, e.g. 'torch.profiler'.")
    candidate: TimingStats | None = None
    baselines: tuple[Baseline, ...] = ()
    ops: tuple[OpRow, ...] = ()
    profiled_calls: int = Field(default=0, description="Calls inside the profiler window; op times cover all of them.")
    custom_share: float | None = Field(default=None, description="Share of op self time in the candidate's own kernels.")
    counters: tuple[Counter, ...] = ()
    counters_note: str | None = Field(default=None, description="Why hardware counters are missing, when they are.")
    notes: tuple[str, ...] = ()
    device: DeviceFacts | None = Field(default=None, description="The device, with its measured ceilings.")
    ncu: tuple[NcuKernel, ...] = Field(default=(), description="Nsight Compute metrics per profiled kernel launch.")
    problem_bytes: int | None = Field(default=None, description="Bytes of inputs and outputs of one call: a floor on its memory traffic.")
    problem_flops: int | None = Field(default=None, description="FLOPs of one call as torch.utils.flop_counter counts them (matmuls, convolutions).")
    achieved_bandwidth_gbs: float | None = Field(default=None, description="problem_bytes / candidate median.")
    bandwidth_fraction: float | None = Field(default=None, description="achieved_bandwidth_gbs / the device's measured copy bandwidth.")
    achieved_tflops: float | None = None
    compute_fraction: float | None = Field(default=None, description="achieved_tflops / the measured matmul rate for the output's dtype.")

    @classmethod
    def roofline(cls, device: DeviceFacts, median_us: float, problem_bytes: int | None, problem_flops: int | None,
                 dtype: str | None) -> dict[str, float | None]:
        """Achieved bandwidth and FLOP/s of one call, and their fractions of the measured ceilings."""
        seconds = median_us / 1e6
        out: dict[str, float | None] = {}
        if problem_bytes and seconds > 0:
            gbs = problem_bytes / seconds / 1e9
            out["achieved_bandwidth_gbs"] = round(gbs, 3)
            if device.peak_bandwidth_gbs:
                out["bandwidth_fraction"] = round(gbs / device.peak_bandwidth_gbs, 4)
        if problem_flops and seconds > 0:
            tflops = problem_flops / seconds / 1e12
            out["achieved_tflops"] = round(tflops, 4)
            peak = device.peak_tflops.get(dtype or "") or device.peak_tflops.get("float32")
            if peak:
                out["compute_fraction"] = round(tflops / peak, 4)
        return out
