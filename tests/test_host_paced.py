"""A call that runs at the host's pace: named from the profile's device time, its speedups widened by the measured
spread of two processes' host paces (KernelBench level 3 on an H200, 2026-12-01: the reference timed as its own
candidate read 0.50-1.54 on such networks, 0.99-1.01 on device-paced problems)."""

from __future__ import annotations

from types import SimpleNamespace

from kforge.profilers.report import (HOST_PACE_RESOLUTION, Baseline, ProfileReport, TimingStats, host_paced_reason,
                                     widen_for_host_pace)
from kforge.tools.process.protocol import RevalidateReply
from kforge.tools.verdict import timing_checks


def _stats(label: str, median_us: float, q1: float, q3: float) -> TimingStats:
    return TimingStats(label=label, samples=300, median_us=median_us, mean_us=median_us, std_us=0.05 * median_us,
                       min_us=0.9 * median_us, max_us=1.5 * median_us, q1_us=q1, q3_us=q3, rel_sem=0.005)


def _efficientnet_b1(**update) -> ProfileReport:
    """level3/23_EfficientNetB1 as its own candidate, as profiled on the H200 (2026-12-01): 87 launches a call,
    1,941 us against eager's 2,995 us in the judge, "faster" [1.34, 1.77]; its device time is set per test."""
    eager = Baseline(name="eager", timing=_stats("eager", 2995.2, 2908.3, 3075.4), speedup=1.5431,
                     speedup_ci=(1.3415, 1.7749), comparison="faster")
    report = ProfileReport(backend="cuda", device_name="NVIDIA H200", collector="torch.profiler",
                           candidate=_stats("candidate", 1941.1, 1881.3, 2048.4), baselines=(eager,),
                           launches_per_call=87.0, device_us_per_call=300.0)
    return report.model_copy(update=update)


def test_a_call_whose_device_idles_most_of_the_time_is_host_paced():
    reason = host_paced_reason(_efficientnet_b1())
    assert "87 kernels" in reason and "300 us" in reason and "15%" in reason and "CUDA graph" in reason, reason
    # Device-paced: its kernels fill the call and the host issued few launches (a CUDA graph's replay is one); a few
    # launches (level-2 fusions, a ReLU whose flushed-cache time is twice its warm-cache kernel); or nothing measured
    # (a CPU backend, whose op table is host time).
    for update in ({"device_us_per_call": 1900.0, "host_launches_per_call": 3.0}, {"launches_per_call": 5.0},
                   {"device_us_per_call": None}, {"launches_per_call": None}):
        assert host_paced_reason(_efficientnet_b1(**update)) == "", update
    # Busy two thirds of the call is host-paced too: ResNet101 (460 launches, 8,951 us of its 13,269 us median on the
    # device) read 0.75 [0.58, 0.99] "slower" against itself on an H200 (2026-12-02).
    resnet = _efficientnet_b1(launches_per_call=460.0, device_us_per_call=8951.0,
                              candidate=_stats("candidate", 13268.7, 12228.0, 13911.5))
    assert "460 kernels" in host_paced_reason(resnet) and "(67%)" in host_paced_reason(resnet)
    # Busy all the call but with kernels shorter than a slow host's launch: ResNet101's eager call was 94% busy in the
    # judge at 19.5 us of kernels a launch and 69% busy in do_bench's process (H200, 2026-12-02).
    busy = _efficientnet_b1(launches_per_call=460.0, device_us_per_call=8993.0,
                            candidate=_stats("candidate", 9560.0, 9500.0, 9600.0))
    assert "average 20 us of device time each" in host_paced_reason(busy) and "(94%)" in host_paced_reason(busy)


def test_its_speedups_are_widened_by_the_host_paces_spread():
    report = widen_for_host_pace(_efficientnet_b1())
    (eager,) = report.baselines
    assert report.host_paced
    assert eager.speedup == 1.5431 and eager.comparison == "no measurable difference", eager
    assert eager.speedup_ci == (round(1.5431 / (1 + HOST_PACE_RESOLUTION), 4), round(1.5431 * (1 + HOST_PACE_RESOLUTION), 4))
    # A speedup beyond the spread still ranks: a candidate captured in a CUDA graph, 4x eager's host-paced call.
    graphed = _efficientnet_b1(baselines=(eager.model_copy(update={"speedup": 4.0, "speedup_ci": (3.8, 4.2)}),))
    assert widen_for_host_pace(graphed).baselines[0].comparison == "faster"
    # GoogleNetInceptionV1 (169 launches) read 0.876 [0.79, 0.97] "slower" against itself, trusted: now it holds 1.
    google = _efficientnet_b1(launches_per_call=169.0, baselines=(eager.model_copy(
        update={"speedup": 0.8762, "speedup_ci": (0.7941, 0.9667), "comparison": "slower"}),))
    lo, hi = widen_for_host_pace(google).baselines[0].speedup_ci
    assert lo < 1 < hi
    # A device-paced call is left as it was.
    steady = _efficientnet_b1(device_us_per_call=1900.0, host_launches_per_call=3.0)
    assert widen_for_host_pace(steady) is steady


def test_its_stable_timing_names_the_cause_and_the_remedy():
    report = widen_for_host_pace(_efficientnet_b1())
    stats = SimpleNamespace(input_sets=38, replay_suspected=False, unseen_work=False, warnings=(), host_median_us=2025.9)
    checks = {c.name: c for c in timing_checks(stats, RevalidateReply(checked=9, wrong=[]), report, "strict")}
    stable = checks["stable_timing"]
    assert stable.status == "fail" and "host's pace" in stable.evidence and "budget_s" not in stable.evidence, stable
    from kforge.tools.models import ProfileResult
    result = ProfileResult.model_construct(output_correct=True, report=report, spec=None)
    assert "fewer kernels" in result._next_step([stable])


def test_the_profile_measures_the_device_time_of_a_call():
    from kforge.tools.profile import _device_pace, _with_device_pace

    prof = SimpleNamespace(device_launches=435, total_us=1500.0, basis="device", rows=[object()])
    assert _device_pace(prof, 5) == {"launches_per_call": 87.0, "host_launches_per_call": None, "device_us_per_call": 300.0}
    graphed = SimpleNamespace(device_launches=435, host_launches=15, total_us=9000.0, basis="device", rows=[object()])
    assert _device_pace(graphed, 5)["host_launches_per_call"] == 3.0
    timed = _efficientnet_b1(launches_per_call=None, device_us_per_call=None)
    paced = _with_device_pace(timed, prof, 5)
    assert paced.host_paced and paced.device_us_per_call == 300.0
    assert paced.baselines[0].comparison == "no measurable difference"
    # The CPU backend's op table is host time: no device time, nothing widened.
    cpu = SimpleNamespace(device_launches=0, total_us=1500.0, basis="cpu", rows=[object()])
    assert _device_pace(cpu, 5)["device_us_per_call"] is None
    steady = _with_device_pace(timed, cpu, 5)
    assert steady.host_paced is None and steady.baselines == timed.baselines


def test_long_calls_are_profiled_fewer_times():
    """torch.profiler's cost is its events: five calls of a KernelBench LSTM (6,244 launches, 41 ms a call) took 6.5 s
    to profile on an H200, five of its bidirectional GRU 17 s (2026-12-01)."""
    from kforge.tools.profile import _PROFILED_CALLS, _profiled_calls

    assert _profiled_calls(7.0) == _profiled_calls(2_000.0) == _PROFILED_CALLS == 5  # a ReLU, a GEMM
    assert _profiled_calls(9_600.0) == 2 and _profiled_calls(41_000.0) == 1  # ResNet101, an LSTM
    assert _profiled_calls(None) == _PROFILED_CALLS


def test_a_flop_count_that_outlasts_its_budget_is_given_up():
    """On the meta device an LSTM runs decomposed, op by op through the counter's dispatch mode: KernelBench level3/35's
    count took 12.5 s of a 28 s profile (H200, 2026-12-01), 7.8 s on the 2-core VM. Past its budget it is given up
    (the judge then tries a real call, or leaves the FLOPs unknown); a short count is untouched."""
    import time

    import pytest
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from kforge.tools.harness.judge import _CountDeadline, _CountTooSlow

    with torch.device("meta"):
        lstm = torch.nn.LSTM(128, 256, num_layers=2, batch_first=True)
        x = torch.randn(10, 512, 128)
    t = time.perf_counter()
    with pytest.raises(_CountTooSlow), torch.no_grad(), FlopCounterMode(display=False), _CountDeadline(0.05):
        lstm(x)
    assert time.perf_counter() - t < 2.0
    a, b = torch.randn(64, 32, device="meta"), torch.randn(32, 16, device="meta")
    with FlopCounterMode(display=False) as counter, _CountDeadline(1.0):
        a @ b
    assert counter.get_total_flops() == 2 * 64 * 32 * 16


def test_one_launch_pace_in_kforges_processes_does_not_narrow_the_widening():
    """KForge's candidate worker and judge read one launch cost (5.8 and 5.9 us) on MobileNetV2, and its graphed
    candidate read 2.01x eager there; do_bench in a process of its own read 1.89-3.07x (H200, 2026-12-02,
    kernelbench-sweep-graphed-h200-2026-12-02-s34): one pace in two processes says nothing of a third's. The interval
    spans HOST_PACE_RESOLUTION whatever the paces read, and the reason gives them."""
    report = _efficientnet_b1()
    cand = report.candidate.model_copy(update={"launch_us": (5.5, 5.9, 6.2)})
    (eager,) = report.baselines
    eager = eager.model_copy(update={"timing": eager.timing.model_copy(update={"launch_us": (5.6, 6.1, 6.7)})})
    one = widen_for_host_pace(report.model_copy(update={"candidate": cand, "baselines": (eager,)}))
    assert one.host_pace_resolution == HOST_PACE_RESOLUTION == 1.5
    assert one.baselines[0].speedup_ci == (round(1.5431 / 2.5, 4), round(1.5431 * 2.5, 4))
    assert "5.9 us for the candidate, eager 6.1 us" in one.host_paced and "2.4x" in one.host_paced, one.host_paced
    unread = widen_for_host_pace(report)
    assert unread.baselines[0].speedup_ci == one.baselines[0].speedup_ci and "us for the candidate" not in unread.host_paced


def test_a_call_that_idles_is_never_faster_than_its_device_time():
    """ResNet18 replayed from a CUDA graph (90 kernels, the device busy all of its 1,297 us) against eager in the judge
    (88 kernels, 1,287 us of device time in a 1,611 us call): 1.24x. In a process at a slower pace do_bench read 2.81-
    2.93x; at its fastest, eager takes its kernels' time, so the speedup cannot fall below 1,287 / 1,297: the interval
    stops there instead of at 1.24 / 2.5 (H200, 2026-12-02, kernelbench-sweep-graphed-h200-2026-12-02-s34)."""
    eager = Baseline(name="eager", timing=_stats("eager", 1610.5, 1590.0, 1630.0), speedup=1.2419,
                     speedup_ci=(1.2, 1.28), comparison="faster", launches_per_call=88.0, device_us_per_call=1286.5)
    graphed = _efficientnet_b1(candidate=_stats("candidate", 1296.8, 1295.5, 1298.3), baselines=(eager,),
                               launches_per_call=90.0, host_launches_per_call=3.0, device_us_per_call=1293.3)
    (wide,) = widen_for_host_pace(graphed).baselines
    assert wide.speedup_ci == (round(1286.5 / 1296.8 / 1.02, 4), round(1.2419 * 2.5, 4)), wide.speedup_ci
    assert wide.speedup_ci[0] < 1 and wide.speedup_ci[1] > 2.93 and wide.comparison == "no measurable difference"
    assert "bounded by the device time" in widen_for_host_pace(graphed).host_paced
    # The reverse: a host-paced candidate against a device-bound baseline can at best take its own device time.
    steady = Baseline(name="eager", timing=_stats("eager", 1900.0, 1890.0, 1910.0), speedup=0.98, speedup_ci=(0.96, 1.0),
                      comparison="no measurable difference", launches_per_call=30.0, device_us_per_call=1880.0)
    slow = _efficientnet_b1(baselines=(steady,), device_us_per_call=1700.0, launches_per_call=400.0)
    (capped,) = widen_for_host_pace(slow).baselines
    assert capped.speedup_ci == (round(0.98 / 2.5, 4), round(1900.0 / 1700.0 * 1.02, 4)), capped.speedup_ci


def test_a_host_paced_baseline_widens_its_speedup_against_a_device_bound_candidate():
    """The reverse side: a candidate captured in a CUDA graph keeps the device busy, but eager's network, timed in the
    judge's process, runs at that host's pace, so the ratio carries the same offset between processes. The speedup
    against eager is widened and the reason names eager; torch.compile's device-paced call is left as timed."""
    eager = Baseline(name="eager", timing=_stats("eager", 2995.2, 2908.3, 3075.4), speedup=1.6,
                     speedup_ci=(1.5, 1.7), comparison="faster", launches_per_call=87.0, device_us_per_call=520.0)
    compiled = Baseline(name="torch.compile", timing=_stats("torch.compile", 1900.0, 1890.0, 1910.0), speedup=1.02,
                        speedup_ci=(1.0, 1.04), comparison="faster", launches_per_call=30.0, device_us_per_call=1850.0)
    graphed = _efficientnet_b1(candidate=_stats("candidate", 1872.0, 1870.0, 1874.0), baselines=(eager, compiled),
                               launches_per_call=87.0, host_launches_per_call=3.0, device_us_per_call=1800.0)
    assert host_paced_reason(graphed) == ""  # the candidate itself is device-bound
    report = widen_for_host_pace(graphed)
    wide, kept = report.baselines
    assert wide.speedup_ci == (round(1.6 / (1 + HOST_PACE_RESOLUTION), 4), round(1.6 * (1 + HOST_PACE_RESOLUTION), 4))
    assert wide.comparison == "no measurable difference" and kept == compiled
    assert report.host_paced.startswith("eager (a baseline): its 87 kernels") and "(17%)" in report.host_paced, report.host_paced
    assert "torch.compile" not in report.host_paced and report.host_pace_resolution == HOST_PACE_RESOLUTION
    # Both device-bound: nothing changes; a baseline without its pace read is judged on the candidate's alone.
    steady = graphed.model_copy(update={"baselines": (
        eager.model_copy(update={"device_us_per_call": 2990.0, "launches_per_call": 30.0}), compiled)})
    assert widen_for_host_pace(steady) is steady
    unread = graphed.model_copy(update={"baselines": (eager.model_copy(update={"device_us_per_call": None}),)})
    assert widen_for_host_pace(unread) is unread
    # A baseline of thousands of short launches is launch-bound whatever its device time.
    launchy = eager.model_copy(update={"launches_per_call": 400.0, "device_us_per_call": 2900.0})
    assert "400 kernels" in widen_for_host_pace(graphed.model_copy(update={"baselines": (launchy,)})).host_paced


def test_the_judge_profiles_a_baselines_pace_after_its_rounds():
    """What the judge's pace op says becomes the baseline's launches and device time per call; a failed read leaves
    them unknown and the speedup as timed."""
    import asyncio

    from kforge.tools.process.protocol import PaceReply
    from kforge.tools.profile import _baseline, _baseline_pace

    class Judge:
        def __init__(self, reply):
            self.reply, self.asked = reply, []

        async def call(self, request, **_):
            self.asked.append(request)
            return self.reply

    judge = Judge(PaceReply(launches=174, host_launches=176, device_us=1040.0))
    pace = asyncio.run(_baseline_pace(judge, "eager", 2995.2))
    (asked,) = judge.asked
    assert asked.label == "eager" and asked.calls == 2
    assert pace == {"launches_per_call": 87.0, "host_launches_per_call": 88.0, "device_us_per_call": 520.0}
    failed = Judge(PaceReply(failure={"kind": "exception", "message": "torch.compile was not timed in this job", "stage": "timing"}))
    assert asyncio.run(_baseline_pace(failed, "torch.compile", 1900.0)) == {}
    timed = {"stats": _stats("eager", 2995.2, 2908.3, 3075.4), "rounds": [[2990.0, 2995.2, 3000.0]] * 3, "pace": pace}
    cand = {"stats": _stats("candidate", 1872.0, 1870.0, 1874.0), "rounds": [[1870.0, 1872.0, 1874.0]] * 3}
    b = _baseline("eager", timed, cand)
    assert b.launches_per_call == 87.0 and b.device_us_per_call == 520.0 and b.speedup > 1.5
