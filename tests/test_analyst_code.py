"""The analyst reads the candidate (issue 20): its source, the compiler's report and the measurements.

Fast tests read real captured compiler output (tests/data/analyst/README.md) and the candidates of
tests/candidates/analyst/, whose right first advice is known. The slow tests build and profile those
candidates with the real tools on the CPU backend (g++, OpenMP, torch.profiler) and summarize the
stored profile, in-process and through an MCP client.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kforge.profilers.analyst import RulesAnalyst
from kforge.profilers.analyst._passes import pass_groups
from kforge.profilers.analyst._stride import stride_kind
from kforge.profilers.analyst.model import analyst_request, parse_answer
from kforge.profilers.analyst.redundant import already_present, prune
from kforge.profilers.analyst.source import read_source
from kforge.profilers.compiler_report import (CompilerFacts, CompilerReport, KernelResources, LoopRemark,
                                              loop_remarks, parse_vectorizer_remarks)
from kforge.profilers.report import Baseline, Counter, OpRow, ProfileReport, TimingStats
from kforge.backends.build.diagnostics import SourceMap, parse_ptxas_resources

HERE = Path(__file__).parent
DATA = HERE / "data" / "analyst"
CANDIDATES = HERE / "candidates" / "analyst"
READ_ONLY = "Load the read-only inputs through the read-only cache"
COALESCE = "Coalesce the global loads"

# Words that would advise adding what a candidate has: (feature, pattern in a recommendation's title or action).
ADVISES = {"parallel": r"omp parallel|paralleli[sz]e", "simd": r"omp simd", "fusion": r"\bfuse\b|fusion"}


def _code(name: str) -> str:
    return (CANDIDATES / f"{name}.py").read_text()


def _report(*, custom_share: float = 0.98, median_us: float = 1000.0, eager: float = 0.5, threads: int = 4,
            bandwidth: float | None = 0.1, calls: int = 1, backend: str = "cpu") -> ProfileReport:
    """A profile of one custom op per forward (5 profiled calls), slower than eager by default."""
    timing = TimingStats.from_samples_s("candidate", [median_us / 1e6] * 20, threads=threads)
    own = 5000.0 * custom_share
    ops = (OpRow(name="kforge::ext.fn", calls=5 * calls, self_time_us=own, total_time_us=own, share=custom_share,
                 is_custom=True),
           OpRow(name="aten::empty", calls=5, self_time_us=5000 - own, total_time_us=5000 - own,
                 share=1 - custom_share, is_custom=False))
    return ProfileReport(backend=backend, device_name="test", collector="torch.profiler", candidate=timing,
                         baselines=(Baseline(name="eager", timing=TimingStats.from_samples_s(
                             "eager", [eager * median_us / 1e6] * 20), speedup=eager),),
                         ops=ops, profiled_calls=5, custom_share=custom_share, bandwidth_fraction=bandwidth)


def _softmax_compiler() -> CompilerFacts:
    """The real g++ report of cpu_softmax_scalar_exp, mapped into the candidate as the loader does."""
    text = (DATA / "gcc12_vec_softmax.txt").read_text()
    remarks, blocking = parse_vectorizer_remarks(text)
    smap = SourceMap(_code("cpu_softmax_scalar_exp"))
    main = (DATA / "gcc12_vec_softmax.main.cpp").read_text()
    source = _code("cpu_softmax_scalar_exp").split('r"""', 1)[1].split('"""', 1)[0]
    smap.add_source("main.cpp", main, [source])
    located = [(smap.candidate_line("main.cpp", r.line), "main.cpp", r) for r in remarks if r.file.endswith("main.cpp")]
    loops = loop_remarks([x for x in located if x[0] is not None])
    return CompilerFacts(builds=[CompilerReport(build="kforge_analyst_softmax", compiler="gcc", loops=loops,
                                                scalar_math=["expf"], blocking_calls=blocking, host_vector_bytes=64)])


def _advises(rec, feature: str) -> bool:
    return bool(re.search(ADVISES[feature], f"{rec.title} {rec.action}", re.I))


# -- the compiler's report ------------------------------------------------------------------------

def test_gcc_vectorizer_report_is_parsed_and_mapped_to_candidate_lines():
    facts = _softmax_compiler()
    loops = {r.line: r for r in facts.builds[0].loops}
    code = _code("cpu_softmax_scalar_exp").splitlines()
    exp_line = next(n for n, line in enumerate(code, 1) if "std::exp" in line)
    scale_line = next(n for n, line in enumerate(code, 1) if "*= inv" in line)
    assert loops[exp_line].vectorized is False  # the loop with the scalar exp call
    assert loops[scale_line].vectorized is True and loops[scale_line].vector_bytes == 16
    assert "__builtin_expf" in facts.builds[0].blocking_calls
    # torch's headers say thousands of things; none of it reaches the report
    assert all(r.line is not None for r in facts.builds[0].loops)


def test_clang_remarks_are_parsed():
    text = ("main.cpp:12:5: remark: vectorized loop (vectorization width: 8, interleaved count: 4) "
            "[-Rpass=loop-vectorize]\n"
            "main.cpp:20:3: remark: loop not vectorized [-Rpass-missed=loop-vectorize]\n")
    remarks, _ = parse_vectorizer_remarks(text)
    loops = loop_remarks([(r.line, "main.cpp", r) for r in remarks])
    assert [(r.line, r.vectorized, r.vector_bytes) for r in loops] == [(12, True, 32), (20, False, None)]


def test_ptxas_sm90_spills_are_parsed():
    (k,) = parse_ptxas_resources((DATA / "ptxas_sm90_spills.txt").read_text())
    assert k.kernel.startswith("mix_kernel")
    assert (k.registers, k.spill_store_bytes, k.spill_load_bytes, k.stack_bytes, k.arch) == (32, 292, 292, 160, "sm_90")
    (r,) = parse_ptxas_resources((DATA / "ptxas_sm90_rowsum.txt").read_text())
    assert (r.registers, r.spill_store_bytes, r.stack_bytes) == (31, 0, 0)


# -- the source ---------------------------------------------------------------------------------------

def test_source_reading_finds_loops_pragmas_and_strides():
    soft = read_source(_code("cpu_softmax_scalar_exp"))
    assert [loop.simd for loop in soft.loops] == [False, True, True, True]
    assert soft.loops[0].parallel and soft.parallel_lines
    assert [fn for _, fn in soft.math_calls] == ["exp"]
    strided = read_source(_code("cpu_strided_inner"))
    (inner,) = strided.innermost()
    assert strided.strided_subscripts(inner)[0][1] == "in[i * cols + j]"
    assert not read_source(_code("cpu_serial_loop")).parallel_lines
    gpu = read_source(_code("cuda_uncoalesced_rowsum"))
    (kernel,) = gpu.gpu_kernels
    assert kernel.name == "rowsum_kernel" and kernel.fast_vars == ("row",)


def test_what_is_already_there_is_not_advised():
    facts = read_source(_code("cpu_softmax_scalar_exp"))
    present = already_present(facts, _report())
    assert {"parallel", "simd", "fusion"} <= set(present)
    action, said = prune("Tune the hot kernel", "Parallelize the outer loop with `#pragma omp parallel for`. Use "
                         "a vector exp in the simd loop.", present)
    assert action == "Use a vector exp in the simd loop." and said
    assert prune("Vectorize the inner loop", "Add `#pragma omp simd` to it.", present)[0] is None
    assert prune("Vectorize the exp() calls", "Compile with -ffast-math so expf vectorizes.", present)[0] is not None
    # naming the pragma proposes it, even in a sentence about exp (a model's answer through summarize_profile did)
    assert prune("Use a vector exp", "Add #pragma omp simd to the exp loop. Compile with -ffast-math.",
                 present)[0] == "Compile with -ffast-math."


_TILED_GEMM = '''cpp = r"""
void mm(const float* A, const float* B, float* C, int64_t n, int64_t kd, int64_t m) {
    #pragma omp parallel for
    for (int64_t i0 = 0; i0 < n; i0 += 64)
        for (int64_t k0 = 0; k0 < kd; k0 += 256)
            for (int64_t i = i0; i < i0 + 64; ++i)
                for (int64_t k = k0; k < k0 + 256; ++k) {
                    const float a = A[i * kd + k];
                    #pragma omp simd
                    for (int64_t j = 0; j < m; ++j) C[i * m + j] += a * B[k * m + j];
                }
}
"""
'''


def test_an_existing_tiling_is_not_advised_again():
    """The matmul text for the hot op says tile, order i-k-j, vectorize: all there in a tiled GEMM."""
    report = _report(eager=1.5)
    report = report.model_copy(update={"ops": tuple(o.model_copy(update={"name": "kforge::ext.matmul"}) if o.is_custom
                                                    else o for o in report.ops)})
    blind = RulesAnalyst().analyze(report)  # without the code, the text proposes all three
    assert any(re.search(r"\btiles?\b", r.action) for r in blind.recommendations), str(blind)
    a = RulesAnalyst().analyze(report, code=_TILED_GEMM)
    assert "tiling" in already_present(read_source(_TILED_GEMM), report)
    for r in a.recommendations:
        assert not re.search(r"\btil(e|es|ing)\b|omp simd|omp parallel|block the loops", f"{r.title} {r.action}"), str(a)
    assert any("dropped 'Tune the hot kernel'" in n for n in a.notes), a.notes


# -- the rules' advice, per candidate ---------------------------------------------------------------------

@pytest.mark.parametrize("name, first, has", [
    ("cpu_serial_loop", "Parallelize the outer loop", set()),
    ("cpu_strided_inner", "Make the inner loop unit-stride", {"parallel"}),
    ("cpu_softmax_scalar_exp", "Vectorize the exp() calls", {"parallel", "simd"}),
    ("cpu_gemm_untiled", "Tile the matmul loops and order them i-k-j", {"parallel"}),
    ("cpu_multipass_chain", "Merge the 3 passes into one loop", {"parallel", "simd"}),
])
def test_first_recommendation_from_the_code(name, first, has):
    compiler = _softmax_compiler() if name == "cpu_softmax_scalar_exp" else None
    a = RulesAnalyst().analyze(_report(), code=_code(name), compiler=compiler)
    assert a.recommendations[0].title == first, str(a)
    assert a.recommendations[0].where and a.recommendations[0].where.startswith("line ")
    assert a.bottleneck != "unknown"
    for feature in has | {"fusion"}:
        assert not any(_advises(r, feature) for r in a.recommendations), (feature, str(a))


def test_ranking_follows_expected_effect():
    a = RulesAnalyst().analyze(_report(), code=_code("cpu_softmax_scalar_exp"), compiler=_softmax_compiler())
    titles = [r.title for r in a.recommendations]
    max_line = _line(_code("cpu_softmax_scalar_exp"), "m = std::max")
    assert titles[:4] == ["Vectorize the exp() calls", f"Make the loop at line {max_line} vectorize",
                          "Compile for this CPU's vector width", "Merge the 3 passes over each row"], titles
    assert a.recommendations[0].confidence == "high"
    assert any(e.metric == "scalar libm imports (nm -D)" for e in a.recommendations[0].evidence)


def test_serial_advice_needs_enough_work_per_call():
    a = RulesAnalyst().analyze(_report(median_us=8.0), code=_code("cpu_serial_loop"))
    assert not any(_advises(r, "parallel") for r in a.recommendations)
    assert any("costs about what it saves" in n for n in a.notes)


def test_bottleneck_from_the_roofline_without_code():
    at_ceiling = RulesAnalyst().analyze(_report(bandwidth=0.9, eager=1.2))
    assert at_ceiling.bottleneck == "memory-bound"
    assert at_ceiling.recommendations[0].title == "Move fewer bytes: the kernel is at the bandwidth ceiling"
    unknown = RulesAnalyst().analyze(_report(bandwidth=0.3, eager=1.2))
    assert unknown.bottleneck == "unknown"
    (note,) = [n for n in unknown.notes if n.startswith("to classify the bottleneck")]
    assert "perf" in note and "steadier" not in note


def test_compute_bound_from_the_measured_matmul_rate():
    at_rate = _report(bandwidth=0.2, eager=1.2).model_copy(update={"compute_fraction": 0.75})
    a = RulesAnalyst().analyze(at_rate)
    assert a.bottleneck == "compute-bound" and "75% of the device's measured matmul rate" in a.bottleneck_why, str(a)
    below = RulesAnalyst().analyze(at_rate.model_copy(update={"compute_fraction": 0.3}))
    assert below.bottleneck == "unknown", str(below)


def _deciding_note(report: ProfileReport) -> str:
    a = RulesAnalyst().analyze(report)
    assert a.bottleneck == "unknown", str(a)
    (note,) = [n for n in a.notes if n.startswith("to classify the bottleneck, add: ")]
    return note.removeprefix("to classify the bottleneck, add: ")


def test_unknown_names_the_one_measurement_that_is_missing():
    """Counters first; with counters, the roofline; with both and neither deciding, the stall breakdown."""
    middle = (Counter(name="cycles", value=1e9), Counter(name="instructions", value=1.5e9))  # IPC 1.5: no class
    assert _deciding_note(_report(bandwidth=0.3, eager=1.2)).startswith("hardware counters from perf")
    assert _deciding_note(_report(bandwidth=0.3, eager=1.2, backend="cuda")).startswith("hardware counters: Nsight")
    no_roofline = _report(bandwidth=None, eager=1.2).model_copy(update={"counters": middle})
    assert _deciding_note(no_roofline).startswith("the achieved bandwidth against the device's measured ceiling")
    both = _report(bandwidth=0.3, eager=1.2).model_copy(update={"counters": middle})
    note = _deciding_note(both)
    assert note.startswith("perf's top-down breakdown") and "achieved bandwidth" not in note  # it was measured


def test_gpu_rules_from_source_and_ptxas():
    rowsum = RulesAnalyst().analyze(_report(backend="cuda"), code=_code("cuda_uncoalesced_rowsum"))
    assert rowsum.recommendations[0].title == "Coalesce the global loads", str(rowsum)
    assert rowsum.bottleneck == "memory-bound"
    kernels = parse_ptxas_resources((DATA / "ptxas_sm90_spills.txt").read_text())
    spills = RulesAnalyst().analyze(_report(backend="cuda"), code=_code("cuda_spills"),
                                    compiler=CompilerFacts(kernels=kernels))
    assert spills.recommendations[0].title == "Stop the register spills in mix_kernel", str(spills)
    assert not any(r.title == "Coalesce the global loads" for r in spills.recommendations)


# -- model analysts get the same facts and the same rule ---------------------------------------------------

def test_model_request_carries_compiler_report_source_and_what_is_there():
    code = _code("cpu_softmax_scalar_exp")
    rules = RulesAnalyst().analyze(_report(), code=code, compiler=_softmax_compiler())
    req = analyst_request(_report(), rules, code=code, compiler=_softmax_compiler())
    assert '"scalar_math"' in req.user and "expf" in req.user
    assert "Already in the code: do not recommend adding these" in req.user and "parallel (line" in req.user
    exp_line = _line(code, "std::exp")
    assert f"{exp_line:4d}  {code.splitlines()[exp_line - 1]}" in req.user  # the source, numbered as the advice cites it
    assert '"median_us"' in req.user and '"speedup": 0.5' in req.user  # the measurements
    assert "Vectorize the exp() calls" in req.user  # the rules' findings


def test_model_answer_is_pruned_of_what_the_code_has():
    code = _code("cpu_softmax_scalar_exp")
    reply = json.dumps({"bottleneck": "compute-bound", "bottleneck_why": "scalar exp",
                        "recommendations": [
                            {"title": "Parallelize the row loop", "action": "Add #pragma omp parallel for."},
                            {"title": "Use a vector exp", "action": "Add #pragma omp simd to the inner loop. "
                             "Compile with -ffast-math -march=native so expf becomes libmvec's vector exp."}]})
    a = parse_answer(reply, "openai:test", None, code=code, report=_report())
    assert [r.title for r in a.recommendations] == ["Use a vector exp"]
    assert a.recommendations[0].action.startswith("Compile with -ffast-math")
    assert any("dropped 'Parallelize the row loop'" in n for n in a.notes)
    only_redundant = json.dumps({"bottleneck": "compute-bound", "bottleneck_why": "x", "recommendations": [
        {"title": "Parallelize the rows", "action": "Use #pragma omp parallel for."}]})
    with pytest.raises(ValueError, match="already has"):
        parse_answer(only_redundant, "openai:test", None, code=code, report=_report())


def test_model_answer_is_pruned_of_what_the_rules_advise_against():
    """Threads for a serial loop whose call takes 8 us: the rules do not advise them, and a model's answer loses them."""
    reply = json.dumps({"bottleneck": "latency-bound", "bottleneck_why": "one core", "recommendations": [
        {"title": "Parallelize the loop", "action": "Add #pragma omp parallel for."},
        {"title": "Call it less often", "action": "Batch the calls."}]})
    code = _code("cpu_serial_loop")
    short = parse_answer(reply, "openai:test", None, code=code, report=_report(median_us=8.0))
    assert [r.title for r in short.recommendations] == ["Call it less often"], short
    assert any("dropped 'Parallelize the loop'" in n and "8 us" in n for n in short.notes), short.notes
    assert "parallel (not worth adding: a call takes 8 us" in analyst_request(_report(median_us=8.0), None, code=code).user
    long = parse_answer(reply, "openai:test", None, code=code, report=_report(median_us=1000.0))
    assert [r.title for r in long.recommendations] == ["Parallelize the loop", "Call it less often"]


def test_loop_remark_str():
    assert str(LoopRemark(line=7, origin="main.cpp:3", vectorized=False, missed=["control flow in loop."])) == \
        "line 7: not vectorized: control flow in loop."


def test_launch_bound_from_the_timed_call_when_the_profiler_inflates_short_ops():
    """The profiler's own overhead made 1.6 us-per-op calls look like 17 us ops (cpu_launch_bound, measured)."""
    a = RulesAnalyst().analyze(_report(median_us=20.0, calls=10, eager=2.5), code=_code("cpu_launch_bound"))
    assert a.bottleneck == "launch-bound", str(a)
    assert a.recommendations[0].title == "Fuse the small ops into one kernel"
    assert any(e.metric == "timed us per op call" for e in a.recommendations[0].evidence)
    assert not any(_advises(r, "parallel") for r in a.recommendations)


# -- GPU loads: uncached read-only inputs (CUDA) and strided blocks (Triton) -------------------------------------

def _line(code: str, text: str) -> int:
    return next(n for n, line in enumerate(code.splitlines(), 1) if text in line)


def _restrict(code: str) -> str:
    """The stencil with its read-only inputs declared `const float* __restrict__`."""
    return code.replace("const float* x, const float* w,", "const float* __restrict__ x, const float* __restrict__ w,")


def test_read_only_inputs_without_restrict_are_found():
    code = _code("cuda_uncached_stencil")
    facts = read_source(code)
    params = _line(code, "__global__ void stencil_kernel(")
    assert [(u.param.name, u.param.line, u.loop_line) for u in facts.uncached_inputs] == \
        [("x", params, _line(code, "for (int k = 0")), ("w", params, _line(code, "for (int k = 0"))]
    assert facts.uncached_inputs[0].param.suggested == "const float* __restrict__ x"
    assert "read-only cache" not in already_present(facts, None)
    for variant in (_restrict(code), code.replace("__fmul_rn(w[k], x[(long)row * cols + c])",
                                                  "__fmul_rn(__ldg(&w[k]), __ldg(&x[(long)row * cols + c]))")):
        marked = read_source(variant)
        assert not marked.uncached_inputs
        assert "read-only cache" in already_present(marked, None)
    store = "    out[(long)row * cols + col] = acc;"
    written = code.replace(store, store + "\n    ((float*)w)[0] = 0.f;")
    assert [u.param.name for u in read_source(written).uncached_inputs] == ["x"]  # w is cast to a writable pointer


def test_read_only_input_advice_is_ranked_by_its_small_effect():
    code = _code("cuda_uncached_stencil")
    a = RulesAnalyst().analyze(_report(backend="cuda", eager=1.5), code=code)
    top = a.recommendations[0]
    assert top.title == READ_ONLY, str(a)  # the only code finding; the bottleneck is unmeasured
    assert top.where == f"line {_line(code, '__global__ void stencil_kernel(')}" and top.confidence == "medium"
    assert "`const float* __restrict__ x`" in top.action and "__ldg" in top.action
    assert any(e.source == "source" and "x (line" in str(e.value) for e in top.evidence)
    slower = RulesAnalyst().analyze(_report(backend="cuda"), code=code)  # slower than eager: that says more
    assert [r.title for r in slower.recommendations][:2] == ["Get faster than eager first", READ_ONLY], str(slower)
    marked = RulesAnalyst().analyze(_report(backend="cuda", eager=1.5), code=_restrict(code))
    assert not any(re.search(r"__restrict__|__ldg|read-only", f"{r.title} {r.action}") for r in marked.recommendations)
    # A measured class (ncu: re-reads from cache) outranks the hint, and a bigger code finding too.
    case = HERE / "data" / "known_bottlenecks" / "naive_matmul"
    naive = RulesAnalyst().analyze(ProfileReport(**json.loads((case / "report.json").read_text())),
                                   code=(case / "candidate.py").read_text())
    titles = [r.title for r in naive.recommendations]
    assert titles[0] == "Reuse data in registers and shared memory" and READ_ONLY in titles[1:], titles
    both = code.replace("x[(long)row * cols + c]", "x[(long)c * cols + row]")  # neighbouring threads a row apart
    titles = [r.title for r in RulesAnalyst().analyze(_report(backend="cuda", eager=1.5), code=both).recommendations]
    assert titles == [COALESCE, READ_ONLY], titles


def test_model_answer_advising_restrict_is_kept_only_where_missing():
    reply = json.dumps({"bottleneck": "memory-bound", "bottleneck_why": "loads", "recommendations": [
        {"title": "Use the read-only cache", "action": "Mark x `const float* __restrict__`."},
        {"title": "Coalesce the loads", "action": "Give each warp a row. Load x with __ldg."}]})
    marked = parse_answer(reply, "openai:test", None, code=_code("cuda_uncoalesced_rowsum"), report=_report(backend="cuda"))
    assert [(r.title, r.action) for r in marked.recommendations] == [("Coalesce the loads", "Give each warp a row.")]
    assert any("dropped 'Use the read-only cache'" in n and "__restrict__" in n for n in marked.notes)
    missing = parse_answer(reply, "openai:test", None, code=_code("cuda_uncached_stencil"), report=_report(backend="cuda"))
    assert [r.title for r in missing.recommendations] == ["Use the read-only cache", "Coalesce the loads"]
    assert "Already in the code" in analyst_request(_report(backend="cuda"), None, code=_code("cuda_uncoalesced_rowsum")).user


def test_stride_factors_are_decided_only_where_the_source_says():
    assert [stride_kind(f) for f in ("cols", "n_cols", "N", "4", "blockDim.x", "row_stride", "(long)K")] == ["strided"] * 7
    assert [stride_kind(f) for f in ("stride", "stride_xk", "s", "0")] == ["unknown"] * 4
    assert stride_kind("1") == "unit" and stride_kind("K", {"K": 1}) == "unit" and stride_kind("S", {"S": 48}) == "strided"


def test_triton_strided_load_gets_the_coalescing_advice():
    code = _code("triton_strided_colsum")
    a = RulesAnalyst().analyze(_report(backend="triton", eager=1.5), code=code)
    top = a.recommendations[0]
    assert top.title == COALESCE and top.where == f"line {_line(code, 'acc += tl.load(')}", str(a)
    assert "n_cols" in top.why and "tl.arange" in top.action and a.bottleneck == "memory-bound"
    assert any(e.metric == "load offset" and e.value == "x_ptr + rows * n_cols + col" for e in top.evidence)


_TRITON = """import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, M, N, stride_m, stride_n, BLOCK: tl.constexpr):
    rm = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rn = tl.arange(0, BLOCK)
    {body}


def launch(x, y):
    M, N = x.shape
    k[(1,)](x, y, M, N, {strides}, BLOCK=64)
"""


@pytest.mark.parametrize("body, strides, flagged", [
    # the tutorial matmul's tile: runtime strides on both axes, 1 on the last for a contiguous tensor
    ("a = tl.load(x_ptr + rm[:, None] * stride_m + rn[None, :] * stride_n)", "x.stride(0), x.stride(1)", False),
    # the unit stride is on axis 0: Triton's coalesce pass orders the layout by contiguity, so it is the fastest
    ("a = tl.load(x_ptr + rm[:, None] + rn[None, :] * stride_n)", "x.stride(0), x.stride(0)", False),
    ("a = tl.load(x_ptr + rm * stride_m)", "x.stride(0), x.stride(1)", True),  # a column of a 2-D tensor
    ("a = tl.load(x_ptr + rm * stride_n)", "x.stride(0), x.stride(1)", False),  # its rows: stride 1
    ("a = tl.load(x_ptr + rm[:, None] * N + rn[None, :] * 2)", "1, 1", True),
    ("i = tl.load(y_ptr + rm)\n    a = tl.load(x_ptr + i * N)", "1, 1", False),  # a gather: stride unknown
])
def test_triton_coalescing_is_advised_only_where_the_source_decides(body, strides, flagged):
    code = _TRITON.format(body=body, strides=strides)
    a = RulesAnalyst().analyze(_report(backend="triton", eager=1.5), code=code)
    assert any(r.title == COALESCE for r in a.recommendations) is flagged, str(a)


@pytest.mark.parametrize("path", [CANDIDATES / "triton_spills.py",
                                  HERE / "adversarial" / "candidates" / "triton_matmul_default_dot.py"])
def test_coalesced_triton_kernels_get_no_coalescing_advice(path):
    a = RulesAnalyst().analyze(_report(backend="triton"), code=path.read_text())
    assert not any(r.title == COALESCE for r in a.recommendations), str(a)


def test_no_gpu_load_findings_on_the_other_candidates():
    """The two load rules on every candidate in the repository: only the known shapes are found."""
    found = {}
    for path in sorted([*(HERE / "candidates").rglob("*.py"), *(HERE / "adversarial" / "candidates").glob("*.py")]):
        facts = read_source(path.read_text())
        names = [u.param.name for u in facts.uncached_inputs] + [f"load@{s.line}" for s in facts.triton_strided_loads]
        if names:
            found[path.stem] = names
    assert found == {"cuda_kb_matmul": ["a", "b"],  # a tiled matmul on plain `const float*`: right, and a minor hint
                     "cuda_uncached_stencil": ["x", "w"], "triton_strided_colsum": ["load@22"]}, found


# -- passes that could be fewer ----------------------------------------------------------------------------------

_SUM = "float sum = 0.f;\nfor (int64_t i = 0; i < n; ++i) sum += x[i];\n"


@pytest.mark.parametrize("body, kind, arrays", [
    # mean, then the spread around it: one pass (Welford, or sum and sum of squares)
    (_SUM + "const float mean = sum / n;\nfloat var = 0.f;\n"
     "for (int64_t i = 0; i < n; ++i) { const float d = x[i] - mean; var += d * d; }", "statistics", ("x",)),
    # an elementwise chain through a temporary, whatever the loops' variables are called
    ("for (int64_t j = 0; j < n; ++j) t[j] = x[j] * 2.f;\nfor (int64_t k = 0; k < n; ++k) o[k] = t[k] + 1.f;",
     "chain", ("t",)),
    # normalizing needs the finished sum: two passes are the algorithm, not a missed merge
    (_SUM + "const float inv = 1.f / sum;\nfor (int64_t i = 0; i < n; ++i) o[i] = x[i] * inv;", None, ()),
    # the second pass reads neighbours of what the first wrote: not the same index
    ("for (int64_t i = 0; i < n; ++i) t[i] = x[i] * 2.f;\n"
     "for (int64_t i = 0; i < n; ++i) o[i] = t[i - 1] + t[i + 1];", None, ()),
    # different ranges are different passes
    ("for (int64_t i = 0; i < n; ++i) t[i] = x[i] * 2.f;\nfor (int64_t i = 0; i < m; ++i) o[i] = t[i];", None, ()),
])
def test_passes_that_could_be_one_are_told_apart_from_those_that_cannot(body, kind, arrays):
    facts = read_source(f'cpp = r"""\nvoid f(const float* x, float* t, float* o, int64_t n, int64_t m) {{\n{body}\n}}\n"""\n')
    groups = pass_groups(facts)
    assert [(g.kind, g.arrays, g.nested) for g in groups] == ([(kind, arrays, False)] if kind else []), groups


def test_multi_pass_advice_is_ranked_by_where_the_passes_run():
    """Passes over the whole tensor stream it from memory each time; passes over a row in cache cost little."""
    chain = RulesAnalyst().analyze(_report(), code=_code("cpu_multipass_chain"))
    top = chain.recommendations[0]
    assert (top.title, top.where, top.confidence) == ("Merge the 3 passes into one loop", "line 27", "high"), str(chain)
    assert "tp, up" in top.why and chain.bottleneck == "memory-bound"
    soft = RulesAnalyst().analyze(_report(), code=_code("cpu_softmax_scalar_exp"), compiler=_softmax_compiler())
    (rows,) = [r for r in soft.recommendations if r.title.startswith("Merge")]
    assert rows.title == "Merge the 3 passes over each row" and rows.confidence == "low" and rows.rank > 1
    assert read_source(_code("cuda_spills")).loops and not pass_groups(read_source(_code("cuda_spills")))  # registers


# -- ranking by expected effect ---------------------------------------------------------------------------------

_SERIAL_EXP = """#include <cmath>
#include <cstdint>
extern "C" void exp_all(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) o[i] = std::exp(in[i]);
}
"""


@pytest.fixture(scope="module")
def serial_exp_compiler(tmp_path_factory) -> CompilerFacts:
    """The serial exp loop built by g++ as the CPU backend builds (-O3, no -ffast-math): it imports scalar expf."""
    import shutil
    import subprocess

    from kforge.profilers.compiler_report import imported_math

    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    tmp = tmp_path_factory.mktemp("serial-exp")
    (tmp / "k.cpp").write_text(_SERIAL_EXP)
    subprocess.run(["g++", "-O3", "-fPIC", "-shared", "-o", str(tmp / "k.so"), str(tmp / "k.cpp")], check=True)
    scalar, vector = imported_math(tmp / "k.so")
    assert "expf" in scalar and not vector
    return CompilerFacts(builds=[CompilerReport(build="k", compiler="gcc", scalar_math=scalar, vector_math=vector)])


@pytest.mark.parametrize("threads, compiled, first", [
    (2, True, "Vectorize the exp() calls"),     # threads save 1/2 of the time, a vector exp ~60%
    (16, True, "Parallelize the outer loop"),  # threads save 15/16
    (2, False, "Parallelize the outer loop"),  # without the compiler's word the exp finding is less sure
])
def test_ranking_weighs_expected_gain_by_confidence(serial_exp_compiler, threads, compiled, first):
    code = f'cpp = r"""\n{_SERIAL_EXP}"""\n'
    a = RulesAnalyst().analyze(_report(threads=threads), code=code, compiler=serial_exp_compiler if compiled else None)
    titles = [r.title for r in a.recommendations]
    assert titles[:2] == [first, ({"Vectorize the exp() calls", "Parallelize the outer loop"} - {first}).pop()], str(a)
    assert all(r.where == "line 5" and r.why and r.confidence for r in a.recommendations[:2]), str(a)
    exp = a.recommendations[titles.index("Vectorize the exp() calls")]
    assert exp.confidence == ("high" if compiled else "medium")


# -- loops the compiler did not vectorize -------------------------------------------------------------------------

# The loop of tests/candidates/analyst/cpu_branchy_loop.py as plain C++ (no torch headers: a fast build).
_BRANCHY = """#include <cmath>
#include <cstdint>
extern "C" void signed_sqrt(const float* in, float* o, int64_t n) {
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) {
        if (in[i] > 0.f) o[i] = in[i] * 2.f;
        else o[i] = std::sqrt(-in[i]);
    }
}
"""


def _gcc_report(tmp_path: Path, source: str, flags: list[str]) -> CompilerFacts:
    """g++ -O3 -fopenmp as the CPU backend builds, with its vectorizer report mapped to the candidate's lines
    (the C++ starts on line 2 of `cpp = r\"\"\"...`)."""
    import shutil
    import subprocess

    from kforge.backends.cpu import vectorizer_flags

    if shutil.which("g++") is None or not any(f.startswith("-fopt-info") for f in vectorizer_flags()):
        pytest.skip("needs GCC's vectorizer report")
    (tmp_path / "k.cpp").write_text(source)
    report = tmp_path / "vec.txt"
    report.unlink(missing_ok=True)
    subprocess.run(["g++", "-O3", "-fopenmp", *flags, f"-fopt-info-vec-optimized-missed={report}", "-c",
                    str(tmp_path / "k.cpp"), "-o", str(tmp_path / "k.o")], check=True)
    remarks, blocking = parse_vectorizer_remarks(report.read_text())
    loops = loop_remarks([(r.line + 1, "k.cpp", r) for r in remarks if r.file.endswith("k.cpp")])
    return CompilerFacts(builds=[CompilerReport(build="k", compiler="gcc", loops=loops, blocking_calls=blocking)])


def test_a_loop_the_compiler_did_not_vectorize_gets_the_change_that_makes_it(tmp_path):
    code = f'cpp = r"""\n{_BRANCHY}"""\n'
    loop_line = _line(code, "for (int64_t i")
    compiler = _gcc_report(tmp_path, _BRANCHY, [])
    # GCC puts an outlined `omp parallel for` loop's remark on its body's first line
    (remark,) = [r for r in compiler.builds[0].loops if loop_line <= r.line <= loop_line + 3]
    assert not remark.vectorized and "control flow" in remark.missed[0]
    a = RulesAnalyst().analyze(_report(), code=code, compiler=compiler)
    top = a.recommendations[0]
    assert (top.title, top.where) == (f"Make the loop at line {loop_line} vectorize", f"line {loop_line}"), str(a)
    assert any(e.source == "compiler" and "control flow" in str(e.value) for e in top.evidence)
    assert not any(_advises(r, "parallel") for r in a.recommendations), str(a)
    # Following the advice: with the flags it names, g++ vectorizes the same loop.
    flags = re.findall(r"`(-f[\w-]+)`", top.action)
    assert set(flags) == {"-fno-trapping-math", "-fno-math-errno"}, top.action
    after = [r for r in _gcc_report(tmp_path, _BRANCHY, flags).builds[0].loops if loop_line <= r.line <= loop_line + 3]
    assert after and all(r.vectorized for r in after), after
    # Without a math call in the loop the errno flag is not advised.
    no_math = _BRANCHY.replace("std::sqrt(-in[i])", "in[i] * 0.5f")
    plain = RulesAnalyst().analyze(_report(), code=f'cpp = r"""\n{no_math}"""\n', compiler=_gcc_report(tmp_path, no_math, []))
    assert plain.recommendations[0].title == f"Make the loop at line {loop_line} vectorize", str(plain)
    assert "-fno-math-errno" not in plain.recommendations[0].action and "-fno-trapping-math" in plain.recommendations[0].action


# The softmax candidate's kernel as plain C++ (no torch headers: a fast build).
_SOFTMAX = """#include <algorithm>
#include <cmath>
#include <cstdint>
extern "C" void softmax(const float* in, float* o, int64_t rows, int64_t cols) {
    #pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * cols;
        float* orow = o + r * cols;
        float m = -INFINITY;
        #pragma omp simd reduction(max:m)
        for (int64_t c = 0; c < cols; ++c) m = std::max(m, row[c]);
        float sum = 0.f;
        #pragma omp simd reduction(+:sum)
        for (int64_t c = 0; c < cols; ++c) { const float e = std::exp(row[c] - m); orow[c] = e; sum += e; }
        const float inv = 1.f / sum;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) orow[c] *= inv;
    }
}
"""


def test_each_inner_loop_is_said_to_vectorize_or_not_and_a_std_max_loop_is_told_why(tmp_path):
    """Issue 20: "it never said whether the hot loop vectorized". The softmax's max loop does not (std::max is a
    branch for GCC, even with `omp simd reduction(max:m)`); its exp loop is the vector-math rule's; its scale loop
    vectorized. Remarks on an `omp simd` pragma's line are GCC's reduction helpers, not the loop."""
    code = _code("cpu_softmax_scalar_exp")
    soft = RulesAnalyst().analyze(_report(), code=code, compiler=_softmax_compiler())
    verdicts = {e.metric: e.value for e in soft.evidence if e.metric.startswith("vectorizer on the loop at line")}
    max_line, exp_line, scale_line = _line(code, "m = std::max"), _line(code, "std::exp"), _line(code, "*= inv")
    assert verdicts == {f"vectorizer on the loop at line {max_line}": "not vectorized: control flow in loop.",
                        f"vectorizer on the loop at line {exp_line}": "not vectorized: couldn't vectorize loop",
                        f"vectorizer on the loop at line {scale_line}": "vectorized (16-byte vectors)"}, verdicts
    (rec,) = [r for r in soft.recommendations if r.title.startswith("Make the loop at line")]
    assert rec.where == f"line {max_line}" and "`m = x > m ? x : m`" in rec.action, str(soft)
    assert not any(f"line {exp_line}" in r.title for r in soft.recommendations)  # the exp loop: vector math
    # Following the advice: g++ vectorizes the max loop once std::max is a conditional expression.
    plain = f'cpp = r"""\n{_SOFTMAX}"""\n'
    plain_max = _line(plain, "m = std::max")
    before = _gcc_report(tmp_path, _SOFTMAX, [])
    assert [r.vectorized for r in before.builds[0].loops if r.line == plain_max] == [False]
    advised = RulesAnalyst().analyze(_report(), code=plain, compiler=before)
    assert any(r.title == f"Make the loop at line {plain_max} vectorize" for r in advised.recommendations), str(advised)
    after = _gcc_report(tmp_path, _SOFTMAX.replace("m = std::max(m, row[c])", "m = row[c] > m ? row[c] : m"), [])
    assert [r.vectorized for r in after.builds[0].loops if r.line == plain_max] == [True]


# -- Triton: num_warps, num_stages and shared memory from the compiled kernel ------------------------------------------

def _triton_sm90(num_stages: int) -> KernelResources:
    """triton_matmul_unpipelined's kernel compiled by Triton for an H100 (sm_90) on this CPU-only host, read as
    backends/triton reads a compiled kernel's metadata (num_warps, num_stages, shared memory)."""
    import importlib.util

    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location("triton_matmul_unpipelined", CANDIDATES / "triton_matmul_unpipelined.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = module.matmul_kernel
    ints = ("M", "N", "K", "stride_am", "stride_bk", "stride_cm")
    signature = {"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32", **{n: "i32" for n in ints},
                 "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    # what a launch on 2048x2048 contiguous tensors specializes: pointers and sizes divisible by 16
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in ("a_ptr", "b_ptr", "c_ptr", *ints)}
    try:
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, attrs=attrs,
                                            constexprs={"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": num_stages})
    except Exception as exc:  # noqa: BLE001 - a Triton without its CUDA toolchain cannot compile for sm_90
        pytest.skip(f"Triton cannot compile for sm_90 here: {exc}")
    meta = compiled.metadata
    return KernelResources(kernel=compiled.name, shared_bytes=meta.shared, num_warps=meta.num_warps,
                           num_stages=meta.num_stages, arch="sm_90")


@pytest.fixture(scope="module")
def triton_matmul_builds() -> dict[int, KernelResources]:
    return {stages: _triton_sm90(stages) for stages in (1, 3)}


def test_triton_kernel_compiled_without_pipelining_is_told_how_many_stages_fit(triton_matmul_builds):
    one, three = triton_matmul_builds[1], triton_matmul_builds[3]
    assert (one.num_stages, one.num_warps, three.num_stages) == (1, 4, 3)
    assert one.shared_bytes == (64 * 32 + 32 * 64) * 4  # one stage: an A and a B tile
    assert one.shared_bytes < three.shared_bytes <= 3 * one.shared_bytes  # more stages, more tiles in flight
    code = _code("triton_matmul_unpipelined")
    a = RulesAnalyst().analyze(_report(backend="triton"), code=code, compiler=CompilerFacts(kernels=[one]))
    top = a.recommendations[0]
    assert top.title == "Pipeline the loads of matmul_kernel's loop", str(a)
    assert top.where == f"line {_line(code, 'num_warps=4, num_stages=1)')}"  # the launch, not the docstring
    assert "num_stages=3 (at most 3 x 16 KiB = 48 KiB of shared memory, of the 227 KiB a block may use on sm_90)" in top.action
    assert {e.metric for e in top.evidence} >= {"num_stages", "num_warps", "shared memory per block [B]"}
    assert a.bottleneck == "latency-bound"
    assert not any(re.search(r"tl\.dot|tensor cores|\btil(e|ing)\b.*(add|use)|\bfuse\b|fusion", f"{r.title} {r.action}",
                             re.I) and r is not top for r in a.recommendations), str(a)
    pipelined = RulesAnalyst().analyze(_report(backend="triton"), code=code.replace("num_stages=1", "num_stages=3"),
                                       compiler=CompilerFacts(kernels=[three]))
    assert not any(r.title.startswith("Pipeline the loads") for r in pipelined.recommendations), str(pipelined)
    # a tile too big for more than one stage: make it smaller first
    huge = one.model_copy(update={"shared_bytes": 150 * 1024})
    big = RulesAnalyst().analyze(_report(backend="triton"), code=code, compiler=CompilerFacts(kernels=[huge]))
    assert big.recommendations[0].action.startswith("Make BLOCK_K (or BLOCK_M, BLOCK_N) smaller first"), str(big)


# -- atomics in hot loops ------------------------------------------------------------------------------------------

_ATOMIC_SUM = """float total = 0.f;
#pragma omp parallel for{clause}
for (int64_t i = 0; i < n; ++i) {{
{atomic}    total += x[i] * x[i];
}}
"""


def test_an_atomic_in_the_hot_loop_is_taken_out():
    atomic = _ATOMIC_SUM.format(clause="", atomic="    #pragma omp atomic\n")
    code = f'cpp = r"""\n{atomic}"""\n'
    a = RulesAnalyst().analyze(_report(), code=code)
    top = a.recommendations[0]
    assert (top.title, top.where) == ("Take the atomic out of the hot loop", f"line {_line(code, 'omp atomic')}"), str(a)
    assert "reduction" in top.action and not any(_advises(r, "parallel") for r in a.recommendations), str(a)
    reduced = _ATOMIC_SUM.format(clause=" reduction(+:total)", atomic="")
    reduced = f'cpp = r"""\n{reduced}"""\n'
    assert not any("atomic" in r.title for r in RulesAnalyst().analyze(_report(), code=reduced).recommendations)
    cuda = ('cuda = r"""\n__global__ void sq_sum(const float* __restrict__ x, float* out, int n) {\n'
            '    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) atomicAdd(out, x[i] * x[i]);\n}\n"""\n')
    gpu = RulesAnalyst().analyze(_report(backend="cuda", eager=1.5), code=cuda)
    assert (gpu.recommendations[0].title, gpu.recommendations[0].where) == ("Take the atomic out of the hot loop",
                                                                            "line 4"), str(gpu)
