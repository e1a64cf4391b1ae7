"""The timing loop, written once against `Backend` (device timers, synchronize, cache flush).

Algorithm (`time_model`), the one `triton.testing.do_bench` uses, plus checks a judge needs:
  1. Warm up: `warmup_calls` calls (JIT compilation, autotuning, allocator growth), an estimate of one
     call, then as many calls as fill `warmup_s` of device time, so the device's clocks settle.
  2. Cross-check, before sampling: a few calls each closed by a device-wide synchronize on the host
     clock, against the device timer on the same calls. When the host saw much more time than the
     device timer (beyond what a synchronize costs by itself), work ran where the timer could not see
     it (another stream, a thread): the candidate is then timed call by call on the host clock, and
     those are its samples. Otherwise:
  3. Sample in batches: queue `flush cache, start timer, call, stop timer` for a batch of calls
     back to back, each on its own input set, then synchronize once and read every timer. The
     device never idles between calls, so it stays at its running clocks: a synchronize and host
     work between calls lets an idle GPU drop its clocks (345 vs 1980 MHz was read on an H100) and
     made single-call medians 1.4-3x longer than do_bench's. Cache flushes stay outside the window.
  4. Stop once there are `min_samples` samples and the median's ~95% interval (order statistics) is
     within `target_rel_ci` of it, or the time budget or `max_samples` is reached. The median, not the mean: what is reported, and what a few slow outliers
     (a preempted launch) do not move; a mean's error with such tails needed 600+ samples of a steady GEMM.
Trade-off: a cold cache per call measures what one call costs from DRAM, which is what a
kernel in a real model usually sees; warm-cache numbers would flatter small kernels.
"""

from __future__ import annotations

import math
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kforge.profilers.report import TimingStats, launch_summary, median_interval

from ..rounds import merge_rounds, replay_warning  # noqa: F401 - merge_rounds: its old home

_replay_warning = replay_warning  # its old name (tests/test_timing.py)

__all__ = ["ReplaySchedule", "Timed", "TimingPolicy", "merge_rounds", "time_model"]

# A host-minus-device gap, beyond what a synchronize costs by itself, above this fraction of the device
# time (and above the floor) means unseen work; calls on repeated inputs this many times faster mean replay.
_UNSEEN_WORK_FRACTION = 0.5
_GAP_FLOOR_S = 5e-6
_MAX_BATCH = 100  # calls queued before one synchronize (each holds two events and maybe an output)
_MAX_TOP_UP = 1000  # warm-up calls queued after the estimate (tiny kernels: the host's queueing is the limit)
_PROBE_EVERY_S = 0.05  # the launch probe's 60 launches (~0.4 ms) at most this often: under 1% of a round's time
# The cross-check's calls fill about this much time, with at least `_MIN_CHECKED_CALLS` of them: hidden work shows
# in every call, so a median of 3 finds it, and 9 calls of a 17 ms convolution were 0.15 s of every round (x9 rounds
# in a profile with torch.compile, H200 2026-12-03).
_CHECK_WINDOW_S = 0.02
_MIN_CHECKED_CALLS = 3


class TimingPolicy:
    def __init__(self, *, warmup_calls: int = 3, warmup_s: float = 0.025, min_samples: int = 10,
                 max_samples: int = 1000, target_rel_ci: float = 0.005, budget_s: float = 1.0,
                 batch_s: float = 0.02, checked_calls: int = 9) -> None:
        if min_samples < 2 or max_samples < min_samples:
            raise ValueError("need 2 <= min_samples <= max_samples")
        self.warmup_calls, self.warmup_s = warmup_calls, warmup_s
        self.min_samples, self.max_samples = min_samples, max_samples
        self.target_rel_ci, self.budget_s = target_rel_ci, budget_s
        self.batch_s, self.checked_calls = batch_s, checked_calls


@dataclass
class Timed:
    """One timing run: its statistics and the raw samples (seconds), which speedup intervals need."""

    stats: TimingStats
    samples_s: list[float] = field(default_factory=list)
    fresh: list[bool] = field(default_factory=list)  # per sample: a set never seen before (replay check)
    # per sample: another process took a CPU during the window (host backends' timers): left out of the replay check
    disturbed: list[bool] = field(default_factory=list)


def _median_rel_ci(samples: Sequence[float]) -> float:
    """Half the width of the median's ~95% interval, relative to the median."""
    lo, hi = median_interval(samples)
    median = statistics.median(samples)
    return (hi - lo) / 2 / median if median > 0 else 0.0


def time_model(label: str, fn: Callable[..., Any], make_args: Callable[[int], Sequence[Any]], backend: Any,
               policy: TimingPolicy, *, fresh_sets: int | None = None, schedule: ReplaySchedule | None = None,
               on_output: Callable[[int, Any], None] | None = None, threads: int | None = None,
               clock: Callable[[], float] = time.perf_counter) -> Timed:
    """Time `fn(*make_args(i))` on `backend` following the algorithm in the module docstring.

    `make_args(i)` gives a call the inputs of set i. With `fresh_sets` distinct sets (or a
    `schedule` kept by the caller across rounds), warm-up uses set 0 and timed calls interleave, in
    a secret random order, sets never seen before with repeats of seen ones; a candidate much faster
    on the repeats is replaying answers. Interleaving keeps drift from looking like replay.
    `on_output(set_index, out)` sees each timed call's output after its timed window closed (on a
    GPU, before the device has finished it: stream order makes copies taken there safe).
    `clock` is the host clock of the cross-check (tests pass a simulated one).
    """
    schedule = schedule or (ReplaySchedule(fresh_sets) if fresh_sets else None)
    next_call = _call_picker(schedule)
    read_clock = getattr(backend, "clock_state", None) or (lambda: None)  # a plug-in backend may not have it
    read_clock()  # its first read starts NVML (tens of ms): before the warm-up, not between timed batches
    per_call_s = _warm_up(fn, make_args, backend, policy, schedule)
    # The cross-check runs before sampling: it decides how the samples are taken, and no call may follow the
    # last timed one before its output is saved (a candidate may reuse its output buffer).
    host_med, unseen, gap_note = _cross_check(fn, make_args, backend, policy, clock, per_call_s)
    contention = getattr(backend, "contention", None)  # host backends count windows another process preempted
    if contention:
        contention()
    clock_reads: list[tuple[float, tuple[str, ...]]] = []

    def while_batch_runs() -> None:  # the device's clock while a queued batch runs
        if (state := read_clock()) is not None:
            clock_reads.append(state)

    probe = getattr(backend, "launch_cost_us", None)
    launch_costs: list[float] = [probe()] if probe is not None else []
    probed = [time.perf_counter()]

    def between_batches() -> None:  # the device idle: the host's launch pace now, at most every _PROBE_EVERY_S
        if probe is not None and time.perf_counter() - probed[0] >= _PROBE_EVERY_S:
            launch_costs.append(probe())
            probed[0] = time.perf_counter()

    if unseen:
        # The device timer misses work: the host clock, closed after a device-wide sync, is the honest time
        # of a call. Time it that way, call by call, and let those be the samples.
        samples, picks, hit_budget = _host_samples(fn, make_args, backend, policy, next_call, on_output, clock)
        disturbed: list[bool] = []
    else:
        batch = max(1, min(_MAX_BATCH, int(policy.batch_s / max(per_call_s, 1e-7))))
        samples, picks, hit_budget, disturbed = _device_samples(fn, make_args, backend, policy, next_call, on_output,
                                                                batch, while_batch_runs, between_batches)
    extra = []
    clocks, slowdowns = _clock_summary(clock_reads)
    if slowdowns:
        hint = getattr(backend, "lock_clocks_hint", "")
        extra.append(f"the device ran below its clock while this was timed ({', '.join(slowdowns)}): a kernel that "
                     "draws this much power or heat runs at the clock it allows, so its time moves with it; compare "
                     f"series timed under the same load, or lock the clocks{f' ({hint})' if hint else ''} for steady "
                     "numbers")
    if contention and (busy := contention().get("warning")):
        extra.append(busy)
    if unseen:
        extra.append(gap_note)
    if hit_budget:
        extra.append(f"time budget of {policy.budget_s:g} s reached before the median's 95% interval narrowed to "
                     f"+-{100 * policy.target_rel_ci:g}%")
    replay = replay_warning(samples, [f for _, f in picks], disturbed) if schedule else None
    extra += [replay] if replay else []
    stats = TimingStats.from_samples_s(label, samples, extra_warnings=extra,
                                       host_median_us=host_med * 1e6 if host_med is not None else None,
                                       unseen_work=unseen, replay_suspected=bool(replay),
                                       input_sets=schedule.sets if schedule else None, threads=threads,
                                       clock="host" if unseen else "device", sm_clock_mhz=clocks,
                                       clock_slowdowns=slowdowns, launch_us=launch_summary(launch_costs))
    return Timed(stats, samples, [f for _, f in picks], disturbed)


def _enough(samples: list[float], t_sampling: float, policy: TimingPolicy) -> tuple[bool, bool]:
    """Stop sampling? (enough samples with a narrow interval of the median, or the budget spent); and was it the
    budget that stopped it before the interval got narrow."""
    steady = len(samples) >= policy.min_samples and _median_rel_ci(samples) <= policy.target_rel_ci
    if steady:
        return True, False
    if time.perf_counter() - t_sampling > policy.budget_s and len(samples) >= 2:
        # Where the work between calls (a flush) took the budget rather than the calls, sample on to min_samples:
        # the replay and stability checks need them. A 2-core VM whose L3 reads 480 MiB flushes 1.2 GB in 0.15 s,
        # and a ReLU's 1 s profile got 2 samples a round, too few for a replaying candidate to show (2026-12-01).
        if len(samples) < policy.min_samples and sum(samples) < policy.budget_s / 2:
            return False, False
        return True, True
    return False, False


def _call_picker(schedule: ReplaySchedule | None) -> Callable[[int], tuple[int, bool]]:
    if schedule is None:
        return lambda call: (call, False)
    return lambda call: schedule.next()


def _warm_up(fn: Callable[..., Any], make_args: Callable[[int], Sequence[Any]], backend: Any,
             policy: TimingPolicy, schedule: ReplaySchedule | None) -> float:
    """Warm up, estimate one call's device time with its flush (do_bench's estimate), then queue enough
    calls to fill `warmup_s` of device time, so the clocks settle before the first timed call.

    The top-up is counted from the estimate, not from the host clock: a GPU queues a call in tens of
    microseconds, so a host-clock loop of 25 ms had queued ~500 calls of an 8 ms kernel (4 s per round)."""
    calls = 0
    for _ in range(policy.warmup_calls):  # first calls: JIT compilation, autotuning, allocator growth
        fn(*make_args(0 if schedule else calls))
        calls += 1
    backend.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        args = make_args(0 if schedule else calls)
        backend.flush_cache()
        fn(*args)
        del args
    backend.synchronize()
    per_call_s = (time.perf_counter() - t0) / 3
    top_up = min(_MAX_TOP_UP, math.ceil(max(0.0, policy.warmup_s - 3 * per_call_s) / max(per_call_s, 1e-7)))
    for _ in range(top_up):
        fn(*make_args(0 if schedule else calls))
    backend.synchronize()
    return per_call_s


def _cross_check(fn: Callable[..., Any], make_args: Callable[[int], Sequence[Any]], backend: Any,
                 policy: TimingPolicy, clock: Callable[[], float],
                 per_call_s: float = 0.0) -> tuple[float | None, bool, str]:
    """Host clock (closed after a device-wide sync) against the device timer on the same calls, on set 0
    (the warm-up's, so no fresh set is spent before the replay check can use it): `policy.checked_calls` of
    them, or as many as fill `_CHECK_WINDOW_S` at `per_call_s` each (at least `_MIN_CHECKED_CALLS`)."""
    if policy.checked_calls < 1:
        return None, False, ""
    calls = min(policy.checked_calls,
                max(_MIN_CHECKED_CALLS, math.ceil(_CHECK_WINDOW_S / per_call_s) if per_call_s > 0 else policy.checked_calls))
    overhead = _timer_overhead_s(backend, clock)
    host, device = [], []
    for _ in range(calls):
        args = make_args(0)
        backend.flush_cache()
        backend.synchronize()
        timer = backend.timer()
        h0 = clock()
        timer.start()
        out = fn(*args)
        timer.stop()
        backend.synchronize()
        host.append(clock() - h0)
        device.append(timer.elapsed_s())
        del out, args
    host_med, device_med = statistics.median(host), statistics.median(device)
    # What the host saw beyond the device timer, less what a synchronize costs by itself (empty windows):
    # honest code leaves ~0 here, whatever its size; hidden work leaves its own duration. Before the loop
    # kept the GPU busy, clocks dropped between calls and hid this: a 20 us side-stream kernel ran 5x longer.
    unseen_s = statistics.median(h - d for h, d in zip(host, device)) - overhead
    unseen = unseen_s > max(_UNSEEN_WORK_FRACTION * device_med, _GAP_FLOOR_S)
    note = (f"the host saw {host_med * 1e6:.1f} us per call but the device timer {device_med * 1e6:.1f} us: "
            "work ran outside the timed stream (another stream or thread); the samples are host-clock times of "
            "calls each closed by a device-wide synchronize")
    return host_med, unseen, note


def _device_samples(fn: Callable[..., Any], make_args: Callable[[int], Sequence[Any]], backend: Any,
                    policy: TimingPolicy, next_call: Callable[[int], tuple[int, bool]],
                    on_output: Callable[[int, Any], None] | None, batch: int,
                    while_batch_runs: Callable[[], None] = lambda: None,
                    between_batches: Callable[[], None] = lambda: None,
                    ) -> tuple[list[float], list[tuple[int, bool]], bool, list[bool]]:
    """Batches of calls queued back to back on the device timer, one synchronize per batch; and per call whether
    another process took a CPU in its window (a host timer's `preemptions`). `while_batch_runs` is called once a
    batch is queued, before the synchronize, while the device likely runs it (the clock is read there);
    `between_batches` after the synchronize, the device idle and no window open (the host's launch pace is read there)."""
    samples: list[float] = []
    picks: list[tuple[int, bool]] = []
    disturbed: list[bool] = []
    t_sampling = time.perf_counter()
    while len(samples) < policy.max_samples:
        timers = []
        for _ in range(min(batch, policy.max_samples - len(samples))):
            set_index, fresh = next_call(len(picks))
            args = make_args(set_index)
            backend.flush_cache()
            timer = backend.timer()
            timer.start()
            out = fn(*args)
            timer.stop()
            timers.append(timer)
            picks.append((set_index, fresh))
            if on_output is not None:
                on_output(set_index, out)
            del out, args
        while_batch_runs()
        backend.synchronize()
        samples += [t.elapsed_s() for t in timers]
        disturbed += [bool(getattr(t, "preemptions", 0)) for t in timers]
        between_batches()
        done, hit_budget = _enough(samples, t_sampling, policy)
        if done:
            return samples, picks, hit_budget, disturbed
    return samples, picks, False, disturbed


def _clock_summary(reads: Sequence[tuple[float, tuple[str, ...]]]) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """(lowest, highest) clock read (empty: none read), and every slowdown reason seen, in the order first seen."""
    if not reads:
        return (), ()
    mhz = [r[0] for r in reads]
    return (min(mhz), max(mhz)), tuple(dict.fromkeys(reason for r in reads for reason in r[1]))


def _host_samples(fn: Callable[..., Any], make_args: Callable[[int], Sequence[Any]], backend: Any,
                  policy: TimingPolicy, next_call: Callable[[int], tuple[int, bool]],
                  on_output: Callable[[int, Any], None] | None, clock: Callable[[], float],
                  ) -> tuple[list[float], list[tuple[int, bool]], bool]:
    samples: list[float] = []
    picks: list[tuple[int, bool]] = []
    t_sampling = time.perf_counter()
    while len(samples) < policy.max_samples:
        pick = next_call(len(picks))
        args = make_args(pick[0])
        backend.flush_cache()
        backend.synchronize()
        h0 = clock()
        out = fn(*args)
        backend.synchronize()
        samples.append(clock() - h0)
        picks.append(pick)
        if on_output is not None:
            on_output(pick[0], out)
        del out, args
        done, hit_budget = _enough(samples, t_sampling, policy)
        if done:
            return samples, picks, hit_budget
    return samples, picks, False


def _timer_overhead_s(backend: Any, clock: Callable[[], float], windows: int = 9) -> float:
    """Median host-minus-device time of empty timer windows: what the sync itself costs."""
    gaps = []
    for _ in range(windows):
        timer = backend.timer()
        h0 = clock()
        timer.start()
        timer.stop()
        backend.synchronize()
        gaps.append(clock() - h0 - timer.elapsed_s())
    return max(0.0, statistics.median(gaps))


class ReplaySchedule:
    """Which input set each timed call gets: fresh ones interleaved with repeats, secretly at random.

    Kept by the caller across rounds of one series, so sets stay fresh until they are first used.
    """

    def __init__(self, sets: int) -> None:
        self.sets = sets
        self.unused = list(range(1, sets))
        self.used = [0]  # warm-up runs on set 0

    def next(self) -> tuple[int, bool]:
        if self.unused and secrets.randbelow(2):
            index = self.unused.pop()
            self.used.append(index)
            return index, True
        return self.used[secrets.randbelow(len(self.used))], False
