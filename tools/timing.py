"""The timing loop, written once against `Backend` (device timers, synchronize, cache flush).

Algorithm (`time_model`):
  1. Warm up: call until both `warmup_calls` calls and `warmup_s` seconds have passed, so JIT
     compilation, autotuning and allocator growth happen before timing.
  2. Sample: for each sample take the next input set (fresh clones, rotating over the sets the
     judge made), flush the device caches and synchronize -- all *outside* the timed window --
     then time exactly one call with the backend's timer.
  3. Stop once there are `min_samples` samples and the relative standard error of the mean is
     below `target_rel_sem`, or the time budget or `max_samples` is reached.
  4. Cross-check: each sample also has a host-clock time closed after a device-wide synchronize.
     When the host saw much more time than the device timer, work ran where the timer could not
     see it (another stream, a thread), and the result says so.
Trade-off: a cold cache per call measures what one call costs from DRAM, which is what a
kernel in a real model usually sees; warm-cache numbers would flatter small kernels.
"""

from __future__ import annotations

import math
import secrets
import statistics
import time
from typing import Any, Callable, Sequence

from kforge.profilers.report import TimingStats

__all__ = ["TimingPolicy", "time_model"]

# A host-minus-device gap above this fraction of the device time (and above twice the timer's own
# overhead) means unseen work; calls on repeated inputs this many times faster mean replay.
_UNSEEN_WORK_FRACTION = 0.5
_GAP_FLOOR_S = 5e-6
_REPLAY_RATIO = 1.5
_REPLAY_NEIGHBOURS = 3  # repeated calls on either side a fresh call is compared with


class TimingPolicy:
    def __init__(self, *, warmup_calls: int = 3, warmup_s: float = 0.05, min_samples: int = 10,
                 max_samples: int = 1000, target_rel_sem: float = 0.005, budget_s: float = 2.0) -> None:
        if min_samples < 2 or max_samples < min_samples:
            raise ValueError("need 2 <= min_samples <= max_samples")
        self.warmup_calls, self.warmup_s = warmup_calls, warmup_s
        self.min_samples, self.max_samples = min_samples, max_samples
        self.target_rel_sem, self.budget_s = target_rel_sem, budget_s


def _rel_sem(samples: Sequence[float]) -> float:
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / math.sqrt(len(samples)) / mean if mean > 0 else 0.0


def time_model(label: str, fn: Callable[..., Any], make_args: Callable[[int], Sequence[Any]], backend: Any,
               policy: TimingPolicy, *, fresh_sets: int | None = None,
               on_output: Callable[[int, Any], None] | None = None) -> TimingStats:
    """Time `fn(*make_args(i))` on `backend` following the algorithm in the module docstring.

    `make_args(i)` gives a call the inputs of set i. With `fresh_sets` distinct sets, warm-up uses
    set 0 and timed calls interleave, in a secret random order, sets never seen before with repeats
    of seen ones; a candidate much faster on the repeats is replaying answers. Interleaving keeps
    drift (clocks, allocator warm-up) from looking like replay.
    `on_output(set_index, out)` sees each timed call's output after its timed window closed.
    """
    schedule = _Schedule(fresh_sets) if fresh_sets else None
    t_start = time.perf_counter()
    calls = 0
    while calls < policy.warmup_calls or time.perf_counter() - t_start < policy.warmup_s:
        fn(*make_args(0 if schedule else calls))
        calls += 1
        if calls >= 10 * policy.warmup_calls and time.perf_counter() - t_start > policy.budget_s:
            break  # very slow model: do not spend the whole budget warming up
    backend.synchronize()
    overhead = _timer_overhead_s(backend)

    samples: list[float] = []
    host_samples: list[float] = []
    sample_fresh: list[bool] = []
    t_sampling = time.perf_counter()
    hit_budget = False
    while len(samples) < policy.max_samples:
        set_index, fresh = schedule.next() if schedule else (calls, False)
        args = make_args(set_index)
        backend.flush_cache()
        backend.synchronize()
        timer = backend.timer()
        timer.start()
        out = fn(*args)
        timer.stop()
        samples.append(timer.elapsed_s())
        host_samples.append(timer.host_elapsed_s())
        sample_fresh.append(fresh)
        if on_output is not None:
            on_output(set_index, out)
        del out, args
        calls += 1
        if len(samples) >= policy.min_samples and _rel_sem(samples) <= policy.target_rel_sem:
            break
        if time.perf_counter() - t_sampling > policy.budget_s and len(samples) >= 2:
            hit_budget = len(samples) < policy.min_samples or _rel_sem(samples) > policy.target_rel_sem
            break
    extra = []
    if hit_budget:
        extra.append(f"time budget of {policy.budget_s:g} s reached before the standard error fell below "
                     f"{100 * policy.target_rel_sem:g}% of the mean")
    device_med, host_med = statistics.median(samples), statistics.median(host_samples)
    # The host window adds only the sync's own cost (measured on empty windows) to the device's; a
    # larger gap is work the device timer's stream never saw.
    unseen = host_med - device_med > max(_UNSEEN_WORK_FRACTION * device_med, 2 * overhead + _GAP_FLOOR_S)
    if unseen:
        extra.append(f"the host saw {host_med * 1e6:.1f} us per call but the device timer {device_med * 1e6:.1f} us: "
                     "work ran outside the timed stream (another stream or thread); the device time understates the cost")
    replay = _replay_warning(samples, sample_fresh) if schedule else None
    extra += [replay] if replay else []
    return TimingStats.from_samples_s(label, samples, host_samples_s=host_samples, extra_warnings=extra,
                                      unseen_work=unseen, replay_suspected=bool(replay), input_sets=fresh_sets)


def _timer_overhead_s(backend: Any, windows: int = 5) -> float:
    """Median host-minus-device time of empty timer windows: what the sync itself costs."""
    gaps = []
    for _ in range(windows):
        timer = backend.timer()
        timer.start()
        timer.stop()
        gaps.append(timer.host_elapsed_s() - timer.elapsed_s())
    return max(0.0, statistics.median(gaps))


class _Schedule:
    """Which input set each timed call gets: fresh ones interleaved with repeats, secretly at random."""

    def __init__(self, sets: int) -> None:
        self.unused = list(range(1, sets))
        self.used = [0]  # warm-up ran on set 0

    def next(self) -> tuple[int, bool]:
        if self.unused and secrets.randbelow(2):
            index = self.unused.pop()
            self.used.append(index)
            return index, True
        return self.used[secrets.randbelow(len(self.used))], False


def _replay_warning(samples: list[float], fresh: list[bool]) -> str | None:
    """Calls on inputs seen before must not be much faster than calls on new ones *next to them*.

    Each fresh call is compared with the repeated calls nearest to it in time, and the verdict is
    the median of those ratios: fresh sets run out partway through sampling, so a global median
    would blame replay for any drift (a noisy neighbour, an allocator still growing) between the
    start and the end of the run. A replaying candidate is faster on every repeat, wherever it is.
    """
    ratios, fresh_times, repeat_times = [], [], []
    for i, is_fresh in enumerate(fresh):
        if not is_fresh:
            continue
        near = [samples[j] for j in range(max(0, i - _REPLAY_NEIGHBOURS), min(len(samples), i + _REPLAY_NEIGHBOURS + 1))
                if not fresh[j]]
        if near:
            ratios.append(samples[i] / max(statistics.median(near), 1e-12))
            fresh_times.append(samples[i])
            repeat_times.extend(near)
    if len(ratios) < 3 or statistics.median(ratios) < _REPLAY_RATIO:
        return None
    return (f"calls on inputs seen before took {statistics.median(repeat_times) * 1e6:.1f} us, calls on new inputs "
            f"next to them {statistics.median(fresh_times) * 1e6:.1f} us (median ratio x{statistics.median(ratios):.1f}): "
            "answers replayed from earlier calls?")
