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

__all__ = ["Counter", "NcuKernel", "OpRow", "ProfileReport", "TimingStats", "compare_words", "format_us", "launch_bound_reason",
           "HOST_PACE_RESOLUTION", "baseline_paced_reason", "host_issued", "host_paced_reason",
           "launch_summary", "widen_for_host_pace", "hottest_kernel", "kernel_base_name", "median_interval", "speedup_interval"]

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
    threads: int | None = Field(default=None, description="Host threads (torch intra-op and OpenMP) the timed calls had.")
    clock: str = Field(default="device", description="'device': each sample is the device timer around one call, calls "
                       "queued back to back as triton.testing.do_bench does; 'host': calls timed one by one on the host "
                       "clock after a device-wide sync (used when the device timer missed work).")
    rounds: int = Field(default=1, description="Rounds the samples came from, interleaved with the other series' rounds.")
    sm_clock_mhz: tuple[float, ...] = Field(default=(), description="Lowest and highest clock (MHz) the device read "
                                            "while the timed batches ran (NVML); empty where it cannot tell.")
    clock_slowdowns: tuple[str, ...] = Field(default=(), description="Why the device ran below its clock while timed "
                                             "(a power cap, heat): its kernels' times then move with the clock.")
    launch_us: tuple[float, ...] = Field(default=(), description=(
        "On a GPU, what the host took to issue one kernel launch, read between the timed batches: lowest, median and "
        "highest (us). A host-paced call's time follows it; empty where nothing was read."))
    warnings: tuple[str, ...] = ()

    @property
    def iqr_us(self) -> float:
        return self.q3_us - self.q1_us

    @classmethod
    def from_samples_s(cls, label: str, samples_s: Sequence[float], *, host_samples_s: Sequence[float] = (),
                       host_median_us: float | None = None, extra_warnings: Sequence[str] = (),
                       **flags: Any) -> TimingStats:
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
        host_median = statistics.median(host_samples_s) * 1e6 if host_samples_s else host_median_us
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
    speedup_ci: tuple[float, float] | None = Field(default=None, description=(
        "About 95% confidence interval of the speedup: from the medians' order statistics and from the spread of "
        "the speedup between interleaved rounds, whichever is wider."))
    comparison: str | None = Field(default=None, description=(
        "'faster' or 'slower' only when speedup_ci excludes 1; otherwise 'no measurable difference'."))
    error: str | None = Field(default=None, description="Why this baseline could not be timed.")
    reused_after_s: float | None = Field(default=None, description=(
        "Set when this timing was taken by an earlier profile of the same reference on this device, with the "
        "same versions and budget, this many seconds ago (KForge re-times a baseline at most every 10 minutes); "
        "None: timed in this run."))
    pending: str | None = Field(default=None, description=(
        "Set while this baseline is still being timed after the profile answered (`late_baselines`): what it waits for "
        "and where it will be added."))
    added_after_s: float | None = Field(default=None, description=(
        "Set when this baseline was timed after the profile answered (a new problem's torch.compile, compiled ahead) "
        "and added this many seconds later, against the profile's own eager timing as its canary."))
    launches_per_call: float | None = Field(default=None, description=(
        "Kernels, copies and memsets one call of this baseline put on the device (torch.profiler in the judge, after "
        "its timed rounds)."))
    host_launches_per_call: float | None = Field(default=None, description=(
        "The host's launch calls behind them (a CUDA graph's replay counts once)."))
    device_us_per_call: float | None = Field(default=None, description=(
        "On a GPU, the device's busy time in one call of this baseline: far below its median, the baseline's call "
        "runs at the host's pace and the speedup against it is widened (see ProfileReport.host_paced)."))


# Two-sided 97.5% quantiles of Student's t by degrees of freedom (rounds - 1).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def median_interval(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """A distribution-free ~95% interval of the median, from order statistics (no normality assumed)."""
    v = sorted(values)
    n = len(v)
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half) - 1)
    hi = min(n - 1, math.ceil(n / 2 + half))
    return v[lo], v[hi]


# The smallest speedup told apart from 1: medians of separate profile calls of one candidate spread 0.7-0.8%
# (KernelBench level2/76 on an H100, 5 calls), and the same kernel timed in the judge's and the candidate's
# processes differs by more than their intervals say: KernelBench's LayerNorm as its own candidate read 0.991,
# 1.002 and 0.987 on an H200 (s25-s26; 0.987 with every candidate sample above the eager median, so the rounds'
# spread did not cover it). 2% is also what issue 16 allows between separate profiles of one candidate.
SPEEDUP_RESOLUTION = 0.02


def speedup_interval(baseline_rounds: Sequence[Sequence[float]], candidate_rounds: Sequence[Sequence[float]],
                     ) -> tuple[float, tuple[float, float]]:
    """Speedup (baseline median / candidate median over all samples) and its ~95% interval.

    Two sources of doubt, and the interval covers both: the noise within each series (the medians'
    order-statistic intervals, combined conservatively) and drift between the two processes over time
    (the series are timed in interleaved rounds; the per-round speedups' spread gives a t-interval).
    """
    base = [s for r in baseline_rounds for s in r]
    cand = [s for r in candidate_rounds for s in r]
    ratio = statistics.median(base) / statistics.median(cand)
    (b_lo, b_hi), (c_lo, c_hi) = median_interval(base), median_interval(cand)
    lo, hi = b_lo / c_hi, b_hi / c_lo
    pairs = [(b, c) for b, c in zip(baseline_rounds, candidate_rounds) if b and c]
    if len(pairs) >= 2:  # a ratio's spread is multiplicative: a t-interval of the per-round log speedups
        logs = [math.log(statistics.median(b) / statistics.median(c)) for b, c in pairs]
        half = _T975.get(len(pairs) - 1, 2.0) * statistics.stdev(logs) / math.sqrt(len(pairs))
        lo, hi = min(lo, ratio * math.exp(-half)), max(hi, ratio * math.exp(half))
    # Never narrower than what separates two processes timing the same kernel: the reference timed as the
    # candidate came out 0.999 [0.998, 1.000] "slower" (LayerNorm) and 1.001 [1.001, 1.002] "faster" (ReLU), and
    # with a 1% floor 0.987 [0.976, 0.997] "slower" (LayerNorm, H200, s26).
    lo, hi = min(lo, ratio / (1 + SPEEDUP_RESOLUTION)), max(hi, ratio * (1 + SPEEDUP_RESOLUTION))
    return ratio, (lo, hi)


def compare_words(interval: tuple[float, float]) -> str:
    lo, hi = interval
    return "faster" if lo > 1 else "slower" if hi < 1 else "no measurable difference"


class NcuKernel(BaseModel):
    """Nsight Compute's view of one kernel launch, condensed to what decides the next change."""

    model_config = ConfigDict(frozen=True)

    name: str
    is_custom: bool
    metrics: dict[str, float] = Field(description="By ncu's display names (clocks left running, as in the timing, so "
                                      "'Duration [us]' compares with the timed median): 'Duration [us]', 'Compute (SM) Throughput', "
                                      "'Memory Throughput', 'DRAM Throughput', 'Achieved Occupancy', ...")
    occupancy_limiter: str | None = Field(default=None, description="What limits blocks per SM: registers, shared memory, warps, blocks.")
    top_stalls: list[tuple[str, float]] = Field(default_factory=list, description="Warp stall reasons, cycles per issued instruction.")
    rules: list[dict[str, str]] = Field(default_factory=list, description="ncu's own rule findings: rule, title, message.")



# A call of this many device launches, each shorter than _LAUNCH_PACE_US of its median, runs at the host's pace: on an
# H200 (2026-11-29) KernelBench level1/57's ConvTranspose2d, which cuDNN ran as an FFT tiling of 3,676 launches a
# call, took 27-30 ms on a free core, 54 ms on a core shared with a busy process, and 27.1 ms as a CUDA graph.
_MANY_LAUNCHES = 100
_LAUNCH_PACE_US = 20.0


def launch_bound(launches: float | None, median_us: float | None) -> bool:
    """Does a call of `launches` device launches and this median run at the host's launch pace?"""
    return bool(launches and median_us and launches >= _MANY_LAUNCHES and median_us / launches <= _LAUNCH_PACE_US)


def host_issued(launches: float | None, host_launches: float | None) -> float | None:
    """The launches a call's host issued one by one: its launch calls where the profile counted them (a CUDA graph's
    replay is one call for all its kernels), else its device launches."""
    return host_launches or launches


def _launch_bound_words(launches: float | None, median: float | None) -> str:
    if not launch_bound(launches, median):
        return ""
    return (f"each call launches {launches:.0f} kernels, {median / launches:.1f} us of its median apiece, about what "
            "the host takes to issue one: the call runs at the host's launch pace, which the host's other work moves, "
            "so its time varies from moment to moment and process to process")


def launch_bound_reason(report: Any) -> str:
    """Why a profile's candidate times vary when its calls are launch-bound (a `ProfileReport`'s launches per call
    and median), else ''."""
    words = _launch_bound_words(host_issued(getattr(report, "launches_per_call", None),
                                            getattr(report, "host_launches_per_call", None)),
                                getattr(getattr(report, "candidate", None), "median_us", None))
    return (f"{words}. Fewer, larger kernels (fused, or a library algorithm that launches fewer) or the call captured "
            "in a CUDA graph make it steady") if words else ""


# A call of this many launches whose kernels keep the device busy for less than this share of its median waits on the
# host for the rest: its time is the host's pace of issuing the launches (Python, the framework, the driver). On an
# H200 (2026-12-02, bench/results/kernelbench-sweep-h200-2026-12-02-s33.md) device-paced level-3 networks kept it
# 0.99-1.01 busy; ResNet101 at 0.67 read 0.75 [0.58, 0.99] "slower" against itself (its eager's process issued at
# another pace) and do_bench of it moved 1.32x within one process; EfficientNetB1 read 0.63 at the host's fast pace
# and 0.44 at its slow one. A share of 0.5 let ResNet101 and EfficientNetB1's 0.63 through.
_HOST_PACED_LAUNCHES = 20
_HOST_PACED_BUSY = 0.9
# ...and one whose kernels average less device time per host-issued launch than this is host-paced even when it kept
# the device busy: a host at its slow pace took 26-43 us per launch of eager level-3 networks in do_bench's process
# (ResNet18 3,766 us for 88 launches; MobileNetV2, ResNet101, EfficientNetB1 26-30 us), and ResNet101's eager call,
# 94% busy in KForge's judge at 19.5 us of kernels a launch, was 69% busy there (H200 2026-12-02, s34). Device-paced
# networks ran 71-930 us of kernels a launch (NetVLAD, MinGPT, MLP, s33).
_SLOW_HOST_LAUNCH_US = 50.0
# How far apart two processes timing the same host-paced call were measured: KernelBench level-3 networks of 87-835
# launches a call (GoogleNet, ResNet, DenseNet, MobileNet, EfficientNet at batch 10), each the reference timed as its
# own candidate, read 0.50-1.54 against eager in the judge's process (one H200, 16 cores, 2026-12-01,
# `bench/kernelbench_sample.py --sweep`), while device-paced problems read 0.99-1.01. The cause is the host: its cost
# of one launch was read at two paces (5.5-6.2 us and 7.8-10 us) from process to process and within one, pinned or not,
# and do_bench itself moved 1.86-2.05x between fresh processes (`bench/explore/host_pace.py`, results
# host-pace-h200-2026-12-01-s32-*). Against a third process, eager's host-paced networks timed in KForge's judge read
# 0.67-2.36x of do_bench's in its own process (ResNet18 1,611 us against 3,648-3,808; EfficientNetB0 4,399 against
# 2,966-3,895; H200 2026-12-02, kernelbench-sweep-graphed-h200-2026-12-02-s34), although the judge and the
# candidate's worker had read one launch cost, so a narrower interval for "one pace" (a factor of 1.3, s32) missed
# do_bench's speedup on 3 of 3 such networks. A speedup involving a host-paced call is known to within this factor
# either way (ratio / (1 + r) .. ratio * (1 + r)), and no further than the device time of the side that idles allows.
HOST_PACE_RESOLUTION = 1.5


def launch_summary(costs_us: Sequence[float]) -> tuple[float, ...]:
    """(lowest, median, highest) of launch-cost reads, rounded; () for none."""
    if not costs_us:
        return ()
    return (round(min(costs_us), 2), round(statistics.median(costs_us), 2), round(max(costs_us), 2))


def _idle_device_reason(launches: float | None, busy: float | None, median: float | None) -> str:
    """Why a call of `launches` host-issued launches keeping the device busy `busy` us of its `median` us waits on the
    host, or would in a slower process (kernels shorter than a slow host's launch), else ''."""
    if not (launches and busy and median) or launches < _HOST_PACED_LAUNCHES:
        return ""
    if busy < _HOST_PACED_BUSY * median:
        return (f"its {launches:.0f} kernels a call keep the device busy {busy:.0f} us of the call's {median:.0f} us "
                f"median ({100 * busy / median:.0f}%): the rest is the host issuing them (Python, the framework, the "
                "driver), so the call runs at the host's pace, which differs from process to process")
    if busy / launches < _SLOW_HOST_LAUNCH_US:
        return (f"its {launches:.0f} launches a call average {busy / launches:.0f} us of device time each, less than a "
                f"host at its slow pace takes to issue one (up to {_SLOW_HOST_LAUNCH_US:.0f} us): it kept the device "
                f"busy here ({100 * busy / median:.0f}%), but in a slower process the same call waits on the host")
    return ""


_STEADY_REMEDY = ("Fewer, larger kernels (fused, or torch.compile) or the forward captured in a CUDA graph make it "
                  "device-bound and steady")


def host_paced_reason(report: Any) -> str:
    """Why a profile's candidate runs at the host's pace (launch-bound, or its device idle most of each call, or its
    kernels shorter than a slow host's launch), else ''."""
    if reason := launch_bound_reason(report):
        return reason
    launches = host_issued(getattr(report, "launches_per_call", None), getattr(report, "host_launches_per_call", None))
    idle = _idle_device_reason(launches, getattr(report, "device_us_per_call", None),
                               getattr(getattr(report, "candidate", None), "median_us", None))
    return f"{idle}. {_STEADY_REMEDY}" if idle else ""


def baseline_paced_reason(baseline: "Baseline") -> str:
    """Why a baseline's call runs at the host's pace (a level-3 network in eager mode), from its own profiled
    launches and device time, else ''."""
    median = baseline.timing.median_us if baseline.timing is not None else None
    launches = host_issued(baseline.launches_per_call, baseline.host_launches_per_call)
    why = _launch_bound_words(launches, median) or _idle_device_reason(launches, baseline.device_us_per_call, median)
    return f"{why}; a speedup against it carries that offset between its process and the candidate's" if why else ""


def widen_for_host_pace(report: "ProfileReport") -> "ProfileReport":
    """The report with a speedup's interval covering how far two processes' host paces can lie apart wherever the
    candidate (`host_paced_reason`) or that baseline (`baseline_paced_reason`) runs at the host's pace; the report
    itself where neither does. The candidate and its baselines are timed in different processes, and the speedup a
    user sees is in a process of their own: for a host-paced call the rounds' spread shows none of that offset, on
    either side of the ratio (a CUDA-graphed candidate against an eager network's host-paced call is as uncertain as
    the reverse). The interval spans HOST_PACE_RESOLUTION either way, except that a call waiting on the host can only
    be slower than its device time, never faster: where only one side idles, its device time bounds the interval on
    that side. The reason says which side, with the launch costs read."""
    own = host_paced_reason(report)
    paced = {b.name: why for b in report.baselines if (why := baseline_paced_reason(b))}
    if not own and not paced:
        return report
    r = HOST_PACE_RESOLUTION
    cand = report.candidate
    widened, paces, bounded = [], [], False
    for b in report.baselines:
        if b.speedup is None or b.speedup_ci is None or not (own or b.name in paced):
            widened.append(b)
            continue
        lo, hi = b.speedup / (1 + r), b.speedup * (1 + r)
        if not own and b.device_us_per_call and cand is not None and cand.median_us > 0:
            # only the baseline idles: at its fastest it takes its kernels' time, so the speedup is at least this
            floor = b.device_us_per_call / cand.median_us / (1 + SPEEDUP_RESOLUTION)
            bounded |= floor > lo
            lo = max(lo, floor)
        if b.name not in paced and report.device_us_per_call and b.timing is not None:
            ceiling = b.timing.median_us / report.device_us_per_call * (1 + SPEEDUP_RESOLUTION)  # the reverse
            bounded |= ceiling < hi
            hi = min(hi, ceiling)
        lo, hi = min(b.speedup_ci[0], round(lo, 4)), max(b.speedup_ci[1], round(hi, 4))
        widened.append(b.model_copy(update={"speedup_ci": (lo, hi), "comparison": compare_words((lo, hi))}))
        if b.timing is not None and len(b.timing.launch_us) > 1:
            paces.append(f"{b.name} {b.timing.launch_us[1]:.1f} us")
    widest = r if any(w is not b for w, b in zip(widened, report.baselines)) else None  # None: no speedup to widen
    reason = "; ".join([own] * bool(own) + [f"{name} (a baseline): {why}" for name, why in paced.items()])
    if widest:
        reason += (f". Each speedup involving it spans a factor of {1 + r:g} either way (another process on this host "
                   f"timed such calls up to 2.4x apart)" + (", bounded by the device time of the side that idles "
                   "(it can only be slower than that)" if bounded else ""))
        if paces and cand is not None and len(cand.launch_us) > 1:
            reason += f"; one launch took {cand.launch_us[1]:.1f} us for the candidate, {', '.join(paces)} (medians)"
    return report.model_copy(update={"baselines": tuple(widened), "host_paced": reason, "host_pace_resolution": widest})


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
    launches_per_call: float | None = Field(default=None, description="Kernels, copies and memsets one profiled call put "
                                            "on the device; hundreds make a call's time follow the host's launch pace.")
    host_launches_per_call: float | None = Field(default=None, description=(
        "The host's launch calls (kernels, copies, memsets, CUDA graph replays) behind them in one profiled call: the "
        "launches that wait on the host; a CUDA graph's replay counts once for all its kernels."))
    device_us_per_call: float | None = Field(default=None, description=(
        "On a GPU, the device's busy time in one profiled call: its kernels' durations summed (torch.profiler). Far "
        "below the timed median, the call waits on the host."))
    host_paced: str | None = Field(default=None, description=(
        "Set when the candidate's call, or a baseline's, runs at the host's pace (many launches, the device idle most "
        "of the call): which, why, and what makes it steady. Each speedup involving such a call then has its interval "
        "cover how far two processes' host paces differ."))
    host_pace_resolution: float | None = Field(default=None, description=(
        "With host_paced: r of the widened intervals (ratio / (1 + r) .. ratio * (1 + r), bounded on the side of a call "
        "whose device time says it can be no faster)."))
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
