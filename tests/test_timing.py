"""The timing loop and its statistics, on a fake backend with a seeded clock (no hardware needed)."""

import random

import pytest

from kforge.profilers.report import TimingStats
from kforge.tools.timing import TimingPolicy, time_model


class FakeTimer:
    def __init__(self, backend):
        self.backend = backend

    def start(self):
        self.t0, self.h0 = self.backend.clock, self.backend.hidden_clock

    def stop(self):
        self.t1, self.h1 = self.backend.clock, self.backend.hidden_clock

    def elapsed_s(self):
        return self.t1 - self.t0

    def host_elapsed_s(self):
        # The host window also waits for hidden work started inside it, and pays the sync itself.
        return self.t1 - self.t0 + (self.h1 - self.h0) + self.backend.sync_s


class FakeBackend:
    """Each call costs `cost_s` plus seeded noise; flushes are counted, never timed."""

    def __init__(self, cost_s, noise=0.0, seed=0):
        self.clock, self.cost_s, self.noise = 0.0, cost_s, noise
        self.rng = random.Random(seed)
        self.flushes = 0
        self.hidden_s = 0.0  # work the device timer cannot see (a side stream)
        self.hidden_clock = 0.0
        self.sync_s = 0.0  # what a host-side device sync costs

    def synchronize(self):
        pass

    def flush_cache(self):
        self.flushes += 1
        self.clock += 1.0  # a flush costs a lot; it must never land inside a timed window

    def timer(self):
        return FakeTimer(self)

    def run(self, *args):
        self.clock += self.cost_s * (1 + self.rng.uniform(-self.noise, self.noise))
        self.hidden_clock += self.hidden_s


def test_steady_kernel_stops_early_with_tight_stats():
    backend = FakeBackend(100e-6)
    seen_args = []
    stats = time_model("candidate", backend.run, lambda i: seen_args.append(i) or [i], backend,
                       TimingPolicy(min_samples=10, budget_s=5))
    assert stats.samples == 10 and stats.median_us == pytest.approx(100.0)
    assert stats.rel_sem == pytest.approx(0.0, abs=1e-9) and not stats.warnings
    assert backend.flushes == stats.samples  # one flush per timed call, outside the window
    assert len(set(seen_args[-10:])) == 10  # each timed call asked for its own inputs


def test_noisy_kernel_warns():
    backend = FakeBackend(100e-6, noise=0.5, seed=1)
    stats = time_model("candidate", backend.run, lambda i: [], backend,
                       TimingPolicy(min_samples=10, max_samples=50, target_rel_sem=1e-6, budget_s=1e9))
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
    stats = time_model("candidate", backend.run, lambda i: [], backend, TimingPolicy(budget_s=5))
    assert stats.median_us == pytest.approx(10.0) and stats.host_median_us == pytest.approx(510.0)
    assert any("outside the timed stream" in w for w in stats.warnings) and stats.unseen_work


def test_sync_overhead_alone_is_not_unseen_work():
    """A tiny kernel whose host window is mostly the sync's own cost is honest."""
    backend = FakeBackend(10e-6)
    backend.sync_s = 30e-6
    stats = time_model("candidate", backend.run, lambda i: [], backend, TimingPolicy(budget_s=5))
    assert stats.host_median_us == pytest.approx(40.0) and not stats.unseen_work
    backend.hidden_s = 60e-6  # the same sync, plus hidden work as long as 6 kernels: flagged
    assert time_model("candidate", backend.run, lambda i: [], backend, TimingPolicy(budget_s=5)).unseen_work


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
    from kforge.tools.timing import _replay_warning

    rng = random.Random(7)
    fresh = [i < 60 and rng.random() < 0.5 for i in range(120)]
    drift = [(3.0 if i < 60 else 1.0) * rng.uniform(0.9, 1.1) for i in range(120)]  # slow first half
    assert _replay_warning(drift, fresh) is None
    replay = [(1.0 if f else 0.05) * rng.uniform(0.9, 1.1) for f in fresh]
    assert "seen before" in (_replay_warning(replay, fresh) or "")
