"""The timing loop and its statistics, on a fake backend with a seeded clock (no hardware needed)."""

import random

import pytest

from kforge.profilers.report import TimingStats
from kforge.tools.harness.timing import TimingPolicy, time_model


class FakeTimer:
    def __init__(self, backend):
        self.backend = backend

    def start(self):
        self.t0 = self.backend.device_clock

    def stop(self):
        self.t1 = self.backend.device_clock

    def elapsed_s(self):
        return self.t1 - self.t0


class FakeBackend:
    """Each call costs `cost_s` plus seeded noise on the device; flushes are counted, never timed.

    `now` is the simulated host clock: it runs with the device's work, and a synchronize also waits for
    work the device timer cannot see (`hidden_s` per call, a side stream) and pays `sync_s`."""

    def __init__(self, cost_s, noise=0.0, seed=0):
        self.device_clock, self.host_clock, self.cost_s, self.noise = 0.0, 0.0, cost_s, noise
        self.rng = random.Random(seed)
        self.flushes = 0
        self.hidden_s = 0.0
        self.hidden_pending = 0.0
        self.sync_s = 0.0
        self.calls = 0

    def now(self):
        return self.host_clock

    def synchronize(self):
        self.host_clock += self.sync_s + self.hidden_pending
        self.hidden_pending = 0.0

    def flush_cache(self):
        self.flushes += 1
        self.device_clock += 1.0  # a flush costs a lot; it must never land inside a timed window
        self.host_clock += 1.0

    def timer(self):
        return FakeTimer(self)

    def run(self, *args):
        cost = self.cost_s * (1 + self.rng.uniform(-self.noise, self.noise))
        self.device_clock += cost
        self.host_clock += cost
        self.hidden_pending += self.hidden_s
        self.calls += 1


def timed(backend, policy, make_args=lambda i: [], **kw):
    return time_model("candidate", backend.run, make_args, backend, policy, clock=backend.now, **kw)


def test_steady_kernel_stops_early_with_tight_stats():
    backend = FakeBackend(100e-6)
    seen_args = []
    run = timed(backend, TimingPolicy(min_samples=10, max_samples=10, budget_s=5),
                make_args=lambda i: seen_args.append(i) or [i])
    stats = run.stats
    assert stats.samples == 10 == len(run.samples_s) and stats.median_us == pytest.approx(100.0)
    assert stats.rel_sem == pytest.approx(0.0, abs=1e-9) and not stats.warnings and stats.clock == "device"
    assert backend.flushes >= stats.samples  # a flush before every timed call, outside the window
    assert len(set(seen_args[-10:])) == 10  # each timed call asked for its own inputs (the cross-check comes first)


def test_noisy_kernel_warns():
    backend = FakeBackend(100e-6, noise=0.5, seed=1)
    stats = timed(backend, TimingPolicy(min_samples=10, max_samples=50, target_rel_ci=1e-6, budget_s=1e9)).stats
    assert stats.samples == 50
    assert any("noisy" in w for w in stats.warnings)
    assert stats.min_us < stats.median_us < stats.max_us


def test_stats_from_samples():
    stats = TimingStats.from_samples_s("x", [1e-3, 2e-3, 3e-3, 4e-3])
    assert stats.median_us == pytest.approx(2500.0) and stats.q1_us == pytest.approx(1750.0)
    assert any("only 4 samples" in w for w in stats.warnings)
    assert "median 2.500 ms" in str(stats)
    with pytest.raises(ValueError):
        TimingStats.from_samples_s("x", [])
    with pytest.raises(ValueError):
        TimingPolicy(min_samples=1)


def test_work_hidden_from_the_device_timer_is_flagged():
    backend = FakeBackend(10e-6)
    backend.hidden_s = 500e-6
    stats = timed(backend, TimingPolicy(budget_s=5)).stats
    # The device timer saw 10 us; the host, closing each call with a sync, 510 us: those are the samples.
    assert stats.host_median_us == pytest.approx(510.0) and stats.median_us == pytest.approx(510.0)
    assert stats.clock == "host" and stats.q1_us <= stats.median_us <= stats.q3_us
    assert any("outside the timed stream" in w for w in stats.warnings) and stats.unseen_work


def test_sync_overhead_alone_is_not_unseen_work():
    """A tiny kernel whose host window is mostly the sync's own cost is honest."""
    backend = FakeBackend(10e-6)
    backend.sync_s = 30e-6
    stats = timed(backend, TimingPolicy(budget_s=5)).stats
    assert stats.host_median_us == pytest.approx(40.0) and not stats.unseen_work and stats.median_us == pytest.approx(10.0)
    backend.hidden_s = 60e-6  # the same sync, plus hidden work as long as 6 kernels: flagged
    assert timed(backend, TimingPolicy(budget_s=5)).stats.unseen_work


def test_the_cross_check_of_a_long_call_takes_fewer_calls_and_still_sees_hidden_work():
    """9 checked calls of a 17 ms convolution were 0.15 s of every round: a long call is checked on 3, enough for
    work hidden in every call to show in their median; a short one on all of `checked_calls`."""
    from kforge.tools.harness.timing import _cross_check

    policy = TimingPolicy(checked_calls=9)
    for per_call_s, calls in ((17e-3, 3), (5e-3, 4), (100e-6, 9)):
        backend = FakeBackend(per_call_s)
        backend.hidden_s = per_call_s  # as long again, on a stream the timer cannot see
        _host, unseen, _note = _cross_check(backend.run, lambda i: [], backend, policy, backend.now, per_call_s)
        assert backend.calls == calls and unseen
        honest = FakeBackend(per_call_s)
        assert not _cross_check(honest.run, lambda i: [], honest, policy, honest.now, per_call_s)[1]
    one = FakeBackend(17e-3)  # a policy asking for fewer (the warm-up's 1) gets what it asked for
    _cross_check(one.run, lambda i: [], one, TimingPolicy(checked_calls=1), one.now, 17e-3)
    assert one.calls == 1


def test_hidden_work_shorter_than_the_sync_itself_is_still_seen():
    """A warm GPU runs a hidden side-stream kernel in ~20 us, less than two syncs cost: the sync's own cost is
    measured on empty windows and subtracted once, so what remains is the hidden work."""
    backend = FakeBackend(5e-6)
    backend.sync_s, backend.hidden_s = 15e-6, 20e-6
    stats = timed(backend, TimingPolicy(budget_s=5)).stats
    assert stats.unseen_work and stats.clock == "host" and stats.median_us == pytest.approx(40.0)


def test_roofline_fractions_of_measured_ceilings():
    from kforge.backends.base import DeviceFacts
    from kforge.profilers.report import ProfileReport

    device = DeviceFacts(backend="cuda", device_name="gpu", peak_bandwidth_gbs=4000.0,
                         peak_tflops={"bfloat16": 800.0, "float32": 50.0})
    # 8 MB in and out in 4 us is 2000 GB/s, half the copy ceiling; 2*1024^3 FLOPs in 4 us is 536.9 TFLOP/s.
    r = ProfileReport.roofline(device, 4.0, 8_000_000, 2 * 1024**3, "bfloat16")
    assert r["achieved_bandwidth_gbs"] == 2000.0 and r["bandwidth_fraction"] == 0.5
    assert r["achieved_tflops"] == pytest.approx(536.87, rel=1e-3) and r["compute_fraction"] == pytest.approx(0.6711, rel=1e-3)
    assert ProfileReport.roofline(device, 4.0, None, 0, "float32") == {}


def test_replay_needs_repeats_faster_than_their_neighbours_not_a_slow_start():
    """Fresh sets run out partway through sampling: a slow start (drift) is not replay, fast repeats are."""
    from kforge.tools.harness.timing import _replay_warning

    rng = random.Random(7)
    fresh = [i < 60 and rng.random() < 0.5 for i in range(120)]
    drift = [(3.0 if i < 60 else 1.0) * rng.uniform(0.9, 1.1) for i in range(120)]  # slow first half
    assert _replay_warning(drift, fresh) is None
    replay = [(1.0 if f else 0.05) * rng.uniform(0.9, 1.1) for f in fresh]
    assert "seen before" in (_replay_warning(replay, fresh) or "")


def test_fresh_calls_another_process_interrupted_do_not_read_as_replay():
    """On a busy host the fresh calls that landed in a burst of other work are slow for that reason: left out
    (their windows were preempted), they no longer read as replay; a real replay still does on the quiet calls."""
    from kforge.tools.harness.timing import _replay_warning

    rng = random.Random(11)
    fresh = [rng.random() < 0.3 for _ in range(90)]
    # Honest calls of 1.0; every fresh one but a few interrupted by another process and three times slower.
    disturbed = [f and i % 7 != 0 for i, f in enumerate(fresh)]
    busy = [(3.0 if d else 1.0) * rng.uniform(0.95, 1.05) for d in disturbed]
    assert "seen before" in (_replay_warning(busy, fresh) or "")  # counted, the burst looks like replay
    assert _replay_warning(busy, fresh, disturbed) is None
    replay = [(1.0 if f else 0.05) * rng.uniform(0.9, 1.1) for f in fresh]
    some = [i % 5 == 0 for i in range(90)]
    assert "seen before" in (_replay_warning(replay, fresh, some) or "")


def test_calls_are_queued_back_to_back_with_one_sync_per_batch():
    """The device must not idle between timed calls (an idle GPU drops its clocks): many calls per sync."""
    backend = FakeBackend(100e-6)
    syncs = []
    real_sync = backend.synchronize
    backend.synchronize = lambda: (syncs.append(backend.calls), real_sync())[1]
    run = timed(backend, TimingPolicy(min_samples=200, max_samples=200, budget_s=5, checked_calls=0))
    assert run.stats.samples == 200
    sampling_syncs = [c for c in syncs if c > 10]  # after warm-up
    assert len(sampling_syncs) <= 200 / 20, f"a sync every {200 / max(1, len(sampling_syncs)):.0f} calls"


def test_rounds_merge_into_one_series_and_the_speedup_interval_covers_one_for_the_same_kernel():
    from kforge.profilers.report import compare_words, speedup_interval
    from kforge.tools.harness.timing import merge_rounds

    rng = random.Random(3)

    def round_reply(cost_us, n=40):
        backend = FakeBackend(cost_us * 1e-6, noise=0.05, seed=rng.randrange(1000))
        run = timed(backend, TimingPolicy(min_samples=n, max_samples=n, budget_s=5))
        return {"timing": run.stats.model_dump(mode="json"), "samples_us": [x * 1e6 for x in run.samples_s],
                "fresh": run.fresh}

    # The same kernel in two processes, drifting together by a few percent between rounds.
    same_a = [round_reply(100 * d) for d in (1.0, 1.03, 0.98)]
    same_b = [round_reply(100 * d) for d in (1.0, 1.03, 0.98)]
    (a, a_rounds), (_, b_rounds) = merge_rounds("eager", same_a), merge_rounds("candidate", same_b)
    assert a.samples == 120 and a.rounds == 3 and a.q1_us <= a.median_us <= a.q3_us
    ratio, ci = speedup_interval(a_rounds, b_rounds)
    assert ci[0] <= 1.0 <= ci[1] and ratio == pytest.approx(1.0, abs=0.03)
    assert compare_words(ci) == "no measurable difference"
    # A kernel twice as fast is called faster; one twice as slow, slower.
    fast = [round_reply(50 * d) for d in (1.0, 1.03, 0.98)]
    ratio, ci = speedup_interval(a_rounds, merge_rounds("candidate", fast)[1])
    assert ratio == pytest.approx(2.0, rel=0.05) and compare_words(ci) == "faster" and ci[0] < 2.0 < ci[1]
    assert compare_words(speedup_interval(merge_rounds("c", fast)[1], a_rounds)[1]) == "slower"


def test_median_interval_is_distribution_free_and_contains_the_median():
    import statistics

    from kforge.profilers.report import median_interval

    rng = random.Random(5)
    values = [rng.expovariate(1.0) for _ in range(101)]
    lo, hi = median_interval(values)
    assert lo < statistics.median(values) < hi
    assert sum(v < lo for v in values) >= 35 and sum(v > hi for v in values) >= 35


class QueuedBackend:
    """A device with a queue, on the real clock: a call is queued at no host cost and runs `cost_s` on the
    device; a synchronize waits (sleeps) for what is queued."""

    def __init__(self, cost_s):
        self.cost_s, self.pending, self.calls = cost_s, 0.0, 0

    def run(self, *args):
        self.pending += self.cost_s
        self.calls += 1

    def flush_cache(self):
        pass

    def synchronize(self):
        import time

        time.sleep(self.pending)
        self.pending = 0.0


def test_warm_up_fills_its_time_on_the_device_not_on_the_host():
    """A GPU queues a call in microseconds: warming up until the host clock passed warmup_s had queued ~500
    calls of an 8 ms kernel, 4 s of device work per timing round."""
    from kforge.tools.harness.timing import _warm_up

    backend = QueuedBackend(0.008)
    policy = TimingPolicy(warmup_calls=3, warmup_s=0.05)
    per_call = _warm_up(backend.run, lambda i: [], backend, policy, None)
    assert per_call == pytest.approx(0.008, rel=0.5)
    # 3 first calls, 3 for the estimate, then about (0.05 - 3 x 0.008) / 0.008 = 4 to fill warmup_s
    assert 3 + 3 + 2 <= backend.calls <= 3 + 3 + 6, backend.calls


def test_a_steady_kernel_with_rare_slow_calls_stops_early_on_its_median():
    """Rare slow calls (a preempted launch) widen a mean's error, not the median's interval: sampling stops at
    the median's precision, long before the budget."""
    class Outliers(FakeBackend):
        def run(self, *args):
            super().run(*args)
            if self.rng.random() < 0.05:
                self.device_clock += 3 * self.cost_s
                self.host_clock += 3 * self.cost_s

    backend = Outliers(100e-6, noise=0.002, seed=3)
    stats = timed(backend, TimingPolicy(min_samples=10, max_samples=1000, budget_s=1e9)).stats
    assert stats.samples < 200 and not stats.warnings, stats
    assert stats.median_us == pytest.approx(100.0, rel=0.005) and stats.q1_us <= stats.median_us <= stats.q3_us


def test_a_speedup_within_the_resolution_is_no_measurable_difference():
    """Two processes timing the same kernel differ by 0.1-1.3% with tight intervals: that is not "faster" (the
    reference as its own candidate, LayerNorm on an H200: 0.987, every candidate sample above eager's median)."""
    from kforge.profilers.report import SPEEDUP_RESOLUTION, compare_words, speedup_interval

    steady = [[1.000e-3 + i * 1e-9 for i in range(100)] for _ in range(3)]
    for shift in (1.001, 1.013, 1 / 1.013):
        shifted = [[s * shift for s in r] for r in steady]
        ratio, ci = speedup_interval(shifted, steady)
        assert ratio == pytest.approx(shift) and ci[0] < 1 < ci[1], (shift, ci)
        assert compare_words(ci) == "no measurable difference"
    clear = [[s * (1 + 3 * SPEEDUP_RESOLUTION) for s in r] for r in steady]
    assert compare_words(speedup_interval(clear, steady)[1]) == "faster"


class ThrottledBackend(FakeBackend):
    """A device whose clock the loop can read (`clock_state`): full speed, then capped by its power limit, when its
    calls also run 1.5x longer (what a power cap does to a heavy kernel). The loop reads it once before its warm-up,
    then once per batch: capped after `capped_after_batches` batches."""

    def __init__(self, cost_s, capped_after_batches, readable=True):
        super().__init__(cost_s)
        self.reads, self.capped_after, self.readable = 0, capped_after_batches, readable

    def clock_state(self):
        self.reads += 1
        if not self.readable:
            return None
        capped = self.reads - 1 > self.capped_after
        if capped:
            self.cost_s = self.base_cost * 1.5
        return (1410.0, ("SW power cap",)) if capped else (1980.0, ())

    def run(self, *args):
        self.base_cost = getattr(self, "base_cost", self.cost_s)
        super().run(*args)


def test_a_device_that_slows_its_clock_while_timed_says_so_and_the_clock_read():
    """Read once per batch while it runs: the lowest and highest clock, and why it ran below its clock."""
    policy = TimingPolicy(min_samples=300, max_samples=400, budget_s=50)  # batches of 100: 3 or 4 of them
    throttled = ThrottledBackend(100e-6, capped_after_batches=1)
    throttled.lock_clocks_hint = "gpuclock --lock"  # the backend's own command (NVIDIA's: nvidia-smi -lgc)
    stats = timed(throttled, policy).stats
    assert stats.sm_clock_mhz == (1410.0, 1980.0) and stats.clock_slowdowns == ("SW power cap",)
    assert any("ran below its clock" in w and "SW power cap" in w and "(gpuclock --lock)" in w
               for w in stats.warnings), stats.warnings
    steady = timed(ThrottledBackend(100e-6, capped_after_batches=10**6), policy).stats
    assert steady.sm_clock_mhz == (1980.0, 1980.0) and steady.clock_slowdowns == ()
    assert not any("below its clock" in w for w in steady.warnings)
    unread = timed(ThrottledBackend(100e-6, 0, readable=False), policy).stats  # NVML cannot tell: nothing said
    assert unread.sm_clock_mhz == () and unread.clock_slowdowns == ()
    plain = timed(FakeBackend(100e-6), policy).stats  # a backend without the method (a plug-in's)
    assert plain.sm_clock_mhz == () and plain.clock_slowdowns == ()


def test_rounds_keep_the_clocks_whole_range_and_every_slowdown():
    from kforge.tools.harness.timing import merge_rounds

    policy = TimingPolicy(min_samples=300, max_samples=400, budget_s=50)
    replies = []
    for capped_after in (10**6, 1):
        run = timed(ThrottledBackend(100e-6, capped_after), policy)
        replies.append({"timing": run.stats.model_dump(mode="json"), "samples_us": [x * 1e6 for x in run.samples_s]})
    merged, _ = merge_rounds("candidate", replies)
    assert merged.sm_clock_mhz == (1410.0, 1980.0) and merged.clock_slowdowns == ("SW power cap",)
    assert sum("ran below its clock" in w for w in merged.warnings) == 1


def test_a_flush_that_outlasts_the_budget_still_leaves_min_samples():
    """On a CPU whose L3 reads 480 MiB, KForge's flush writes 1.2 GB, 0.15 s (the 2-core VM of 2026-12-01): a ReLU's
    1 s profile got 2 samples a round, and a replaying candidate no longer showed. Calls that fill the budget
    themselves still stop it."""
    import time as real_time

    class SlowFlush(FakeBackend):
        def flush_cache(self):
            super().flush_cache()
            real_time.sleep(0.02)

    policy = TimingPolicy(min_samples=10, max_samples=100, target_rel_ci=1e-9, budget_s=0.05, warmup_s=0.0)
    backend = SlowFlush(5e-6, noise=0.3)
    assert timed(backend, policy).stats.samples >= 10
    long_calls = SlowFlush(0.04, noise=0.3)  # each call's own time (simulated) fills the budget: stops as before
    assert timed(long_calls, policy).stats.samples < 10


def test_the_hosts_launch_pace_is_read_between_batches_and_kept():
    """A GPU backend's `launch_cost_us` (what the host takes to issue one launch) is read before sampling and then
    between batches, with the device idle and no window open, at most every _PROBE_EVERY_S; the stats keep its lowest,
    median and highest, and a round merge keeps them over the rounds. A backend without it reads nothing."""
    import time as real_time

    from kforge.tools.harness import timing
    from kforge.tools.rounds import merge_rounds

    class Paced(FakeBackend):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.reads, self.windows_open = [], 0

        def launch_cost_us(self):
            assert self.windows_open == 0, "read inside a timed window"
            self.reads.append(real_time.perf_counter())
            return 6.0 + len(self.reads) % 3  # 7, 8, 6, 7, ...

        def timer(self):
            backend, timer = self, FakeTimer(self)
            start, stop = timer.start, timer.stop
            timer.start = lambda: (setattr(backend, "windows_open", backend.windows_open + 1), start())
            timer.stop = lambda: (stop(), setattr(backend, "windows_open", backend.windows_open - 1))
            return timer

        def run(self, *args):
            super().run(*args)
            real_time.sleep(0.002)  # host time, so the probe's gate opens every few batches

    policy = TimingPolicy(min_samples=60, max_samples=60, target_rel_ci=1e-9, budget_s=5, batch_s=1e-3)
    backend = Paced(1e-3)
    stats = timed(backend, policy).stats
    assert len(backend.reads) >= 2, backend.reads
    gaps = [b - a for a, b in zip(backend.reads, backend.reads[1:])]
    assert min(gaps) >= timing._PROBE_EVERY_S * 0.99, gaps
    costs = [6.0 + (i + 1) % 3 for i in range(len(backend.reads))]
    assert stats.launch_us == (min(costs), sorted(costs)[len(costs) // 2] if len(costs) % 2 else
                               (sorted(costs)[len(costs) // 2 - 1] + sorted(costs)[len(costs) // 2]) / 2, max(costs))
    assert timed(FakeBackend(1e-3), policy).stats.launch_us == ()

    def reply(low, mid, high):
        t = TimingStats.from_samples_s("eager", [1e-3] * 10, launch_us=(low, mid, high))
        return {"samples_us": [1000.0] * 10, "timing": t.model_dump()}

    merged, _ = merge_rounds("eager", [reply(5.5, 5.9, 6.2), reply(7.8, 8.2, 10.0), reply(5.6, 6.0, 6.1)])
    assert merged.launch_us == (5.5, 6.0, 10.0)
