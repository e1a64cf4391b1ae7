"""The rule-based analyst and the pasted-text parser, on built reports and saved profiler output (no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

import kforge.profilers.analyst as analyst_pkg
from kforge.profilers.analyst import (Analysis, RulesAnalyst, load_provider, parse_profile_text)
from kforge.profilers.analyst._remedies import SLOWER_THAN_EAGER
from kforge.profilers.analyst.text import parse_time_us
from kforge.profilers.report import Baseline, Counter, OpRow, ProfileReport, TimingStats

DATA = Path(__file__).parent / "data" / "analyst"


def _timing(label: str, median_us: float, *, iqr_fraction: float = 0.02, warnings: tuple[str, ...] = ()) -> TimingStats:
    half = median_us * iqr_fraction / 2
    return TimingStats(label=label, samples=50, median_us=median_us, mean_us=median_us, std_us=half, min_us=median_us - 2 * half,
                       max_us=median_us + 2 * half, q1_us=median_us - half, q3_us=median_us + half, rel_sem=0.001,
                       warnings=warnings)


def _report(ops: list[tuple[str, int, float, float]], *, candidate_us: float | None = 100.0,
            speedups: dict[str, float] | None = None, profiled_calls: int = 5, backend: str = "cpu",
            counters: tuple[Counter, ...] = (), counters_note: str | None = None,
            candidate: TimingStats | None = None) -> ProfileReport:
    """ops: (name, calls, self_us, total_us); shares and custom share computed like tools/profile.py."""
    window = sum(o[2] for o in ops) or 1.0
    rows = tuple(OpRow(name=n, calls=c, self_time_us=s, total_time_us=t, share=s / window,
                       is_custom=n.startswith("kforge::")) for n, c, s, t in ops)
    custom = [r for r in rows if r.is_custom]
    timing = candidate or (_timing("candidate", candidate_us) if candidate_us else None)
    baselines = tuple(Baseline(name=n, timing=_timing(n, candidate_us * s), speedup=s)
                      for n, s in (speedups or {}).items()) if timing else ()
    return ProfileReport(backend=backend, device_name="test cpu", collector="torch.profiler", candidate=timing,
                         baselines=baselines, ops=rows, profiled_calls=profiled_calls,
                         custom_share=min(1.0, sum(r.total_time_us for r in custom) / window) if rows else None,
                         counters=counters, counters_note=counters_note)


def _analyze(report: ProfileReport | None, **kw) -> Analysis:
    return RulesAnalyst().analyze(report, **kw)


# A candidate that only calls aten ops: it has no kernel of its own.
FRAMEWORK = [("aten::addmm", 5, 600.0, 650.0), ("aten::gelu", 5, 250.0, 250.0), ("aten::add", 5, 100.0, 100.0),
             ("aten::empty", 5, 20.0, 20.0)]
# A good custom kernel: 95% of op time in its own range, twice as fast as eager.
GOOD = [("kforge::ext.matmul_tiled", 5, 950.0, 955.0), ("aten::empty", 5, 50.0, 50.0)]
# Twelve tiny custom kernels per call: launch overhead, not work.
LAUNCH = [(f"kforge::ext.step{i}", 5, 12.0, 12.0) for i in range(12)] + [("aten::empty_like", 60, 6.0, 6.0)]


def test_framework_bound_when_the_candidate_calls_no_kernel_of_its_own():
    a = _analyze(_report(FRAMEWORK, speedups={"eager": 0.95}))
    assert a.bottleneck == "framework-bound"
    assert "calls no kernel of its own" in a.bottleneck_why
    top = a.recommendations[0]
    assert (top.title, top.where, top.confidence) == ("Write and call your own kernel", "aten::addmm", "high")
    assert "aten::gelu" in top.action


def test_framework_bound_when_custom_share_is_low_names_top_framework_op():
    a = _analyze(_report([("aten::addmm", 5, 700.0, 700.0), ("kforge::ext.bias_gelu", 5, 200.0, 200.0),
                          ("aten::copy_", 5, 100.0, 100.0)]))
    assert a.bottleneck == "framework-bound"
    assert a.recommendations[0].title == "Move aten::addmm into your kernel"
    assert a.recommendations[0].confidence == "high"  # 20% custom share is below CUSTOM_SHARE_CLEAR


def test_launch_bound_chain_of_small_kernels():
    a = _analyze(_report(LAUNCH))
    assert a.bottleneck == "launch-bound"
    assert a.recommendations[0].title == "Fuse the small ops into one kernel"
    ops_per_call = next(e for e in a.evidence if e.metric == "ops_per_call")
    assert ops_per_call.value == 24.0  # (12 * 5 + 60) calls over 5 profiled calls


def test_a_gpu_call_of_thousands_of_short_launches_is_launch_bound_by_its_measured_launch_count():
    """The op table keeps its top rows only (25 names); the profile counts every launch (`launches_per_call`). A
    ConvTranspose2d run as an FFT tiling (level1/57 on an H200: 3,676 launches a call, 29 ms) shows a few long rows."""
    median_us = 29_000.0
    rows = tuple(OpRow(name=f"fft_tile_kernel_{i}", calls=5, self_time_us=10.0, total_time_us=10.0,
                       device_time_us=5 * median_us / 3, share=1 / 3, is_custom=False) for i in range(3))
    report = ProfileReport(backend="cuda", device_name="test gpu", collector="torch.profiler",
                           candidate=_timing("candidate", median_us), ops=rows, profiled_calls=5)
    assert _analyze(report).bottleneck != "launch-bound"  # three long rows, as far as the table shows
    counted = _analyze(report.model_copy(update={"launches_per_call": 3676.0}))
    assert counted.bottleneck == "launch-bound"
    assert next(e for e in counted.evidence if e.metric == "ops_per_call").value == 3676.0
    assert "3676 kernel launches per forward in a 29000 us call" in counted.bottleneck_why
    # The same kernels replayed from a CUDA graph: the host issued 3 launches a call (the replay, the input's copy,
    # the output's clone; what the profile read for every graphed KernelBench network on an H200, 2026-12-02).
    graphed = _analyze(report.model_copy(update={"launches_per_call": 3676.0, "host_launches_per_call": 3.0}))
    assert graphed.bottleneck != "launch-bound", graphed.bottleneck_why


def test_good_custom_kernel_gets_generic_hot_kernel_advice_and_no_speed_alarm():
    a = _analyze(_report(GOOD, speedups={"eager": 2.0, "torch.compile": 1.3}))
    assert a.bottleneck == "unknown"
    assert any("hardware counters" in n for n in a.notes)
    top = a.recommendations[0]
    assert (top.title, top.where) == ("Tune the hot kernel", "kforge::ext.matmul_tiled")
    assert "#pragma omp parallel for" in top.action and "tiles that fit in cache" in top.action  # matmul-like
    assert all(r.title != "Get faster than eager first" for r in a.recommendations)


def test_slower_than_eager_comes_first_with_a_direction():
    a = _analyze(_report(GOOD, speedups={"eager": 0.5, "torch.compile": 0.4}))
    top = a.recommendations[0]
    assert top.title == "Get faster than eager first"
    assert top.action == SLOWER_THAN_EAGER["unknown"]
    assert top.confidence == "high"
    assert {e.metric for e in top.evidence} == {"speedup_vs_eager", "speedup_vs_torch.compile"}


def test_faster_than_eager_but_slower_than_compile_points_at_fusion():
    ops = [("kforge::ext.matmul_tiled", 5, 650.0, 655.0), ("aten::add", 5, 300.0, 300.0), ("aten::empty", 5, 50.0, 50.0)]
    a = _analyze(_report(ops, speedups={"eager": 1.4, "torch.compile": 0.7}))
    rec = next(r for r in a.recommendations if r.title == "Fuse as much as torch.compile does")
    assert "torch.compile's fusion shows the headroom" in rec.action


def test_a_fully_fused_kernel_slower_than_compile_is_not_told_to_fuse():
    """Issue 20: one kernel doing the whole forward was told 'Fuse as much as torch.compile does'."""
    a = _analyze(_report(GOOD, speedups={"eager": 1.4, "torch.compile": 0.7}))
    assert not any("fus" in r.title.lower() for r in a.recommendations)
    rec = next(r for r in a.recommendations if r.title == "Close the gap to torch.compile inside your kernel")
    assert "not fusion" in rec.why


def test_noisy_timing_lowers_speed_confidence_and_notes_it():
    noisy = _timing("candidate", 100.0, iqr_fraction=0.3, warnings=("noisy: IQR is 30% of the median",))
    a = _analyze(_report(GOOD, speedups={"eager": 0.5}, candidate=noisy))
    rec = next(r for r in a.recommendations if r.title == "Get faster than eager first")
    assert rec.confidence == "medium"
    assert any("noisy" in n for n in a.notes)


def test_perf_low_ipc_and_high_miss_rate_is_memory_bound():
    counters = (Counter(name="cycles", value=1e9), Counter(name="instructions", value=6e8),
                Counter(name="cache-references", value=1e7), Counter(name="cache-misses", value=4e6))
    a = _analyze(_report(GOOD, counters=counters))
    assert a.bottleneck == "memory-bound"
    assert a.recommendations[0].title == "Cut memory traffic in the hot kernel"
    assert {e.metric for e in a.evidence} >= {"IPC", "cache miss rate"}


def test_perf_high_ipc_is_compute_bound_with_simd_advice():
    counters = (Counter(name="cycles", value=1e9), Counter(name="instructions", value=3e9),
                Counter(name="cache-references", value=1e7), Counter(name="cache-misses", value=1e5))
    a = _analyze(_report(GOOD, counters=counters))
    assert a.bottleneck == "compute-bound"
    assert "#pragma omp simd" in a.recommendations[0].action


def test_structure_outranks_counters():
    counters = (Counter(name="cycles", value=1e9), Counter(name="instructions", value=3e9))
    assert _analyze(_report(FRAMEWORK, counters=counters)).bottleneck == "framework-bound"


def test_counters_note_and_missing_data_become_notes():
    a = _analyze(_report([], candidate_us=None, counters_note="perf not found on PATH"))
    assert a.bottleneck == "unknown"
    assert "hardware counters unavailable: perf not found on PATH" in a.notes
    assert any(n.startswith("to classify the bottleneck, add: an op table") for n in a.notes)


def test_alloc_copy_ops_recommend_preallocation():
    a = _analyze(_report([("kforge::ext.fn", 5, 700.0, 700.0), ("aten::zeros", 5, 150.0, 150.0),
                          ("aten::contiguous", 5, 100.0, 100.0), ("aten::relu", 5, 50.0, 50.0)]))
    rec = next(r for r in a.recommendations if r.title == "Preallocate outputs and drop copies")
    assert rec.where == "aten::zeros"
    assert next(e for e in rec.evidence if e.metric == "alloc_copy_share").value == 0.25


def test_previous_fills_changes():
    before = _report(FRAMEWORK, candidate_us=200.0, speedups={"eager": 0.9})
    after = _report(GOOD, candidate_us=100.0, speedups={"eager": 1.8})
    changes = _analyze(after, previous=before).changes
    assert changes[0] == "candidate median 200.00 us -> 100.00 us (x2.00, faster)"
    assert "speedup vs eager x0.90 -> x1.80" in changes
    assert "custom share 0% -> 96%" in changes  # 955 us of 1000
    assert "new in the top 5 ops: kforge::ext.matmul_tiled" in changes
    assert "gone from the top 5 ops: aten::addmm, aten::gelu, aten::add" in changes
    assert _analyze(after).changes == []


CODE = '''import torch
from torch.utils.cpp_extension import load_inline

cpp = """
torch::Tensor matmul_tiled(torch::Tensor a, torch::Tensor b);
"""
src = """
#include <torch/extension.h>
torch::Tensor matmul_tiled(torch::Tensor a, torch::Tensor b) {
    return a;
}
"""
ext = load_inline("ext", cpp_sources=[cpp, src], functions=["matmul_tiled"])

class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return ext.matmul_tiled(a, b)
'''


def test_code_turns_custom_function_into_line_number():
    a = _analyze(_report(GOOD), code=CODE)
    top = a.recommendations[0]
    assert top.where == "line 9"  # the definition, not the declaration (line 5) or the call (line 17)
    assert CODE.splitlines()[8].startswith("torch::Tensor matmul_tiled(")
    # Framework op names are not looked up in the candidate's code.
    assert _analyze(_report(FRAMEWORK), code=CODE).recommendations[0].where == "aten::addmm"


def test_analysis_is_deterministic():
    report = _report(FRAMEWORK + GOOD, speedups={"eager": 0.8, "torch.compile": 0.5})
    assert _analyze(report) == _analyze(report)
    assert [r.rank for r in _analyze(report).recommendations] == list(range(1, len(_analyze(report).recommendations) + 1))


def test_str_shows_bottleneck_and_rank_one_title():
    a = _analyze(_report(FRAMEWORK, speedups={"eager": 0.95}))
    text = str(a)
    assert text.startswith("Bottleneck: framework-bound (")
    assert f"1. {a.recommendations[0].title}" in text
    assert 3 <= len(text.splitlines()) <= 8


def test_str_golden_for_ncu_text():
    a = _analyze(None, text=(DATA / "ncu_details_handwritten.txt").read_text())
    assert str(a) == (
        "Bottleneck: latency-bound (neither memory (12%) nor compute (2%) is busy: the kernel waits on latency; "
        "achieved occupancy is 2% of a theoretical 25%; the grid fills 0.02 of one wave over the SMs, so launch "
        "more blocks)\n"
        "  1. Expose more parallelism in the hot kernel (softmax_rows_kernel(const float *, float *, int, int)) "
        "[high]: Raise occupancy (enough blocks for several waves over the SMs, fewer registers or less shared "
        "memory per block) and give each thread more independent work (ILP).\n"
        "  note: analysed ncu output parsed from text, so fewer facts: no timing, no baselines, no calls per forward")


def test_load_provider():
    assert isinstance(load_provider("rules"), RulesAnalyst)
    assert load_provider("rules").name == "rules"
    with pytest.raises(KeyError, match="rules"):
        load_provider("nope")


def test_public_surface():
    assert sorted(analyst_pkg.__all__) == sorted(
        ["Analysis", "AnalystProvider", "Bottleneck", "Evidence", "Recommendation", "RulesAnalyst", "load_provider",
         "parse_profile_text"])


# ---- pasted text ---------------------------------------------------------------------------------------------

def test_parse_time_units():
    assert parse_time_us("1.234ms") == pytest.approx(1234.0)
    assert parse_time_us("56.000us") == 56.0
    assert parse_time_us("2.000s") == 2e6
    assert parse_time_us("--") is None


def test_torch_table_framework_heavy_capture():
    text = (DATA / "torch_cpu_framework_heavy.txt").read_text()
    r = parse_profile_text(text)
    assert r is not None and (r.collector, r.backend, r.custom_share) == ("torch.profiler", "cpu", 0.0)
    assert len(r.ops) == 9
    top = r.ops[0]
    assert (top.name, top.calls, top.self_time_us, top.total_time_us) == ("aten::mul", 25, 81.258, 156.243)
    assert top.share == pytest.approx(81.258 / 363.533)  # against 'Self CPU time total', not the row sum
    a = _analyze(r, text=text)
    assert a.bottleneck == "framework-bound"
    assert a.recommendations[0].where == "aten::mul"
    assert any(rec.title == "Fuse the small ops into one kernel" for rec in a.recommendations)


def test_torch_table_custom_range_capture():
    text = (DATA / "torch_cpu_custom_range.txt").read_text()
    r = parse_profile_text(text)
    assert r is not None
    custom = [o for o in r.ops if o.is_custom]
    assert [(o.name, o.calls, o.total_time_us) for o in custom] == [("kforge::ext.fused_gelu_linear", 5, 467.236)]
    assert r.custom_share == pytest.approx(467.236 / 650.288)
    # The range holds 72% of op time, but its own code only 29%: it mostly calls aten::gelu and aten::mm.
    a = _analyze(r, text=text)
    assert a.bottleneck == "framework-bound"
    assert a.recommendations[0].title == "Replace the at:: calls inside kforge::ext.fused_gelu_linear"


def test_torch_table_with_device_columns():
    r = parse_profile_text((DATA / "torch_cuda_table_handwritten.txt").read_text())
    assert r is not None and r.backend == "cuda"
    kernel = r.ops[0]
    assert (kernel.name, kernel.device_time_us, kernel.calls) == ("fused_softmax_kernel(float const*, float*, int, int)",
                                                                  412.352, 5)
    assert kernel.share == pytest.approx(412.352 / 511.552)  # device share when the table has device time
    assert r.ops[1].name.endswith("...")
    assert r.custom_share == pytest.approx(412.352 / 511.552)  # the range's CUDA total


def test_torch_table_tolerates_stripped_indentation_and_missing_columns():
    text = (DATA / "torch_cpu_framework_heavy.txt").read_text()
    stripped = "\n".join(line.strip() for line in text.splitlines())
    r = parse_profile_text(stripped)
    assert r is not None and (r.ops[0].name, r.ops[0].calls) == ("aten::mul", 25)
    minimal = "\n".join(["-----------  ----------  ----------", "       Name    Self CPU  # of Calls",
                         "-----------  ----------  ----------", "  aten::add     3.000us           2",
                         "-----------  ----------  ----------"])
    r = parse_profile_text(minimal)
    assert r is not None and (r.ops[0].self_time_us, r.ops[0].total_time_us, r.ops[0].calls) == (3.0, 3.0, 2)


def test_ncu_csv_handwritten():
    text = (DATA / "ncu_details_handwritten.csv").read_text()
    for pasted in (text, "==PROF== Connected to process 48213 (/usr/bin/python3.11)\n" + text):
        r = parse_profile_text(pasted)
        assert r is not None and (r.collector, r.backend) == ("ncu", "cuda")
        assert r.custom_share is None
        fused = r.ops[0]
        assert (fused.name.split("(")[0], fused.calls, fused.device_time_us) == ("fused_add_relu_kernel", 2, 135.75)
        values = {c.name: c for c in r.counters}
        assert values["DRAM Throughput"].value == 88.61  # the longest launch of the top kernel
        assert values["Elapsed Cycles"].value == 108041.0  # thousands separator
        assert values["Duration [fused_add_relu_kernel]"].value == 67.80
        assert "Function Cache Configuration" not in values  # text-valued metric
        assert any(n.startswith("DRAM Throughput [void at::native::vectorized_elementwise_kernel") for n in values)
    a = _analyze(r, text=text)
    assert a.bottleneck == "memory-bound"
    assert "fewer bytes" in a.recommendations[0].action  # 89% of DRAM peak: at the ceiling


def test_ncu_text_handwritten():
    r = parse_profile_text((DATA / "ncu_details_handwritten.txt").read_text())
    assert r is not None and r.collector == "ncu" and r.device_name == "GPU (compute capability 9.0)"
    values = {c.name: c.value for c in r.counters}
    assert values["DRAM Throughput"] == 3.81 and values["Achieved Occupancy"] == 1.56
    assert values["Threads"] == 2048.0
    assert not any(n.startswith(("OPT", "Est.")) for n in values)  # rule verdicts are not metrics
    assert [(o.name, o.device_time_us) for o in r.ops] == [("softmax_rows_kernel(const float *, float *, int, int)", 25.92)]


def test_ncu_compute_bound_from_counters():
    counters = (Counter(name="Compute (SM) Throughput", value=91.0, unit="%"),
                Counter(name="Memory Throughput", value=35.0, unit="%"))
    report = ProfileReport(backend="cuda", device_name="H100", collector="ncu",
                           ops=(OpRow(name="gemm_kernel", calls=1, self_time_us=50.0, total_time_us=50.0,
                                      device_time_us=50.0, share=1.0, is_custom=False),), counters=counters)
    a = _analyze(report)
    assert a.bottleneck == "compute-bound"
    assert "tensor cores" in a.recommendations[0].action


def test_ncu_kernel_name_located_in_code():
    code = "src = '''\n__global__ void softmax_rows_kernel(const float* x, float* y, int r, int c) {\n}\n'''\n"
    a = _analyze(None, text=(DATA / "ncu_details_handwritten.txt").read_text(), code=code)
    assert a.recommendations[0].where == "line 2"


def test_unrecognized_text():
    assert parse_profile_text("hello world\nnothing to see") is None
    with pytest.raises(ValueError, match="torch.profiler"):
        _analyze(None, text="hello world")
