"""Defects a held-out review found (2026-11-24): candidates not in the repo, profiled and summarized through an MCP
client on the CPU backend. Each test rebuilds the finding from the same kind of code, compiler output and
measurements, without the held-out files: a tanh*sigmoid serial loop, a row-wise L2 norm in three passes, a strided
column sum, a naive matmul.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kforge.profilers.analyst import RulesAnalyst
from kforge.profilers.compiler_report import CompilerFacts, CompilerReport, imported_math
from kforge.profilers.report import Baseline, OpRow, ProfileReport, TimingStats


def _report(*, threads: int = 2, median_us: float = 400_000.0, eager: float = 0.44, compiled: float | None = None,
            bandwidth: float | None = 0.1, compute: float | None = None, counters_note: str | None = None) -> ProfileReport:
    """One custom op per forward holding all op time, timed against eager (and torch.compile when given)."""
    timing = TimingStats.from_samples_s("candidate", [median_us / 1e6] * 20, threads=threads)
    ops = (OpRow(name="kforge::ext.fn", calls=5, self_time_us=5000.0, total_time_us=5000.0, share=1.0, is_custom=True),)
    baselines = [Baseline(name="eager", timing=TimingStats.from_samples_s("eager", [eager * median_us / 1e6] * 20),
                          speedup=eager)]
    if compiled is not None:
        baselines.append(Baseline(name="torch.compile", speedup=compiled, timing=TimingStats.from_samples_s(
            "torch.compile", [compiled * median_us / 1e6] * 20)))
    return ProfileReport(backend="cpu", device_name="test", collector="torch.profiler", candidate=timing,
                         baselines=tuple(baselines), ops=ops, profiled_calls=5, custom_share=1.0,
                         bandwidth_fraction=bandwidth, compute_fraction=compute, counters_note=counters_note)


def _candidate(cpp: str) -> str:
    return f'cpp = r"""\n{cpp}"""\n'


def _line(code: str, text: str) -> int:
    return next(n for n, line in enumerate(code.splitlines(), 1) if text in line)


# -- a serial loop calling two scalar libm functions -----------------------------------------------------------------

_TANH_SIGMOID = """#include <cmath>
#include <cstdint>
extern "C" void tanh_sigmoid(const float* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float v = in[i];
        const float t = std::tanh(v);
        const float s = 1.0f / (1.0f + std::exp(-v));
        out[i] = t * s;
    }
}
"""


def _imports(tmp: Path, source: str, flags: list[str]) -> CompilerFacts:
    """The libm functions the library g++ builds from `source` imports (-O3 as the CPU backend builds, plus `flags`)."""
    if shutil.which("g++") is None or shutil.which("nm") is None:
        pytest.skip("needs g++ and nm")
    (tmp / "k.cpp").write_text(source)
    subprocess.run(["g++", "-O3", "-fPIC", "-shared", *flags, "-o", str(tmp / "k.so"), str(tmp / "k.cpp")], check=True)
    scalar, vector = imported_math(tmp / "k.so")
    return CompilerFacts(builds=[CompilerReport(build="k", compiler="gcc", scalar_math=scalar, vector_math=vector)])


def test_scalar_math_advice_names_every_scalar_call_of_the_loop_and_describes_its_pragmas(tmp_path):
    """Held-out: "Vectorize the tanh() calls" for a loop calling tanh and exp, both imported scalar (expf, tanhf), with
    a why saying the call "stays scalar even where the loop around it has `#pragma omp simd`" in a loop with no pragma,
    and an action for "the simd loop"."""
    code = _candidate(_TANH_SIGMOID)
    compiler = _imports(tmp_path, _TANH_SIGMOID, [])
    assert {"expf", "tanhf"} <= set(compiler.builds[0].scalar_math)
    a = RulesAnalyst().analyze(_report(), code=code, compiler=compiler)
    (rec,) = [r for r in a.recommendations if r.title.startswith("Vectorize the")]
    assert rec.title == "Vectorize the tanh() and exp() calls", str(a)
    (imports,) = [e for e in rec.evidence if e.metric == "scalar libm imports (nm -D)"]
    assert set(str(imports.value).split(", ")) == {"tanhf@GLIBC", "expf@GLIBC"}
    assert f"line {_line(code, 'std::tanh')}" in rec.why and f"line {_line(code, 'std::exp')}" in rec.why
    # the loop as it is: no simd pragma
    assert "has no `#pragma omp simd`" in rec.why and "even" not in rec.why, rec.why
    assert "simd loop" not in rec.action, rec.action
    # the same loop with the pragma is described as having it
    simd_cpp = _TANH_SIGMOID.replace("    for (int64_t i", "    #pragma omp simd\n    for (int64_t i")
    simd = RulesAnalyst().analyze(_report(), code=_candidate(simd_cpp), compiler=compiler)
    (simd_rec,) = [r for r in simd.recommendations if r.title.startswith("Vectorize the")]
    assert "even in this `#pragma omp simd` loop" in simd_rec.why, simd_rec.why
    # Following the advice: with the flag it names, g++ calls libmvec's variants of both, and the finding goes away
    # (the scalar symbols stay imported for the loop's tail).
    assert "`-ffast-math`" in rec.action
    after = _imports(tmp_path, _TANH_SIGMOID, ["-ffast-math"])
    assert any(s.endswith("_expf") for s in after.builds[0].vector_math)
    assert any(s.endswith("_tanhf") for s in after.builds[0].vector_math)
    fixed = RulesAnalyst().analyze(_report(), code=code, compiler=after)
    assert not any(r.title.startswith("Vectorize the") for r in fixed.recommendations), str(fixed)


# -- a strided column sum: each fact once ---------------------------------------------------------------------------

_COLSUM = """#include <cstdint>
extern "C" void column_totals(const float* src, float* dst, int64_t nrows, int64_t ncols) {
    #pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < ncols; c++) {
        double running = 0.0;
        for (int64_t r = 0; r < nrows; r++) {
            running += src[r * ncols + c];
        }
        dst[c] = static_cast<float>(running);
    }
}
"""


def _vectorizer_report(tmp: Path, source: str) -> CompilerFacts:
    """g++ -O3 -fopenmp as the CPU backend builds, its vectorizer report mapped to the candidate's lines (the C++
    starts on line 2 of `cpp = r\"\"\"...`)."""
    from kforge.backends.cpu import vectorizer_flags
    from kforge.profilers.compiler_report import loop_remarks, parse_vectorizer_remarks

    if shutil.which("g++") is None or not any(f.startswith("-fopt-info") for f in vectorizer_flags()):
        pytest.skip("needs GCC's vectorizer report")
    (tmp / "k.cpp").write_text(source)
    report = tmp / "vec.txt"
    subprocess.run(["g++", "-O3", "-fopenmp", f"-fopt-info-vec-optimized-missed={report}", "-c", str(tmp / "k.cpp"),
                    "-o", str(tmp / "k.o")], check=True)
    remarks, blocking = parse_vectorizer_remarks(report.read_text())
    loops = loop_remarks([(r.line + 1, "k.cpp", r) for r in remarks if r.file.endswith("k.cpp")])
    return CompilerFacts(builds=[CompilerReport(build="k", compiler="gcc", loops=loops, blocking_calls=blocking,
                                                host_vector_bytes=64)])


def test_each_fact_is_cited_once_in_the_evidence(tmp_path):
    """Held-out: "vectorizer on line 24" and "vectorizer on the loop at line 24" both cited "not vectorized: control
    flow in loop", and bandwidth_fraction was listed twice, by two rules wording its threshold differently."""
    code = _candidate(_COLSUM)
    inner = _line(code, "for (int64_t r")
    compiler = _vectorizer_report(tmp_path, _COLSUM)
    assert any(r.line == inner and not r.vectorized for r in compiler.builds[0].loops), compiler
    a = RulesAnalyst().analyze(_report(threads=4, median_us=20_000.0, eager=0.08, bandwidth=0.0139), code=code,
                               compiler=compiler)
    assert a.recommendations[0].title == "Make the inner loop unit-stride", str(a)
    verdicts = [e for e in a.evidence if e.source == "compiler" and str(e.value).startswith("not vectorized")]
    assert [e.metric for e in verdicts] == [f"vectorizer on the loop at line {inner}"], verdicts
    assert [e.metric for e in a.evidence].count("bandwidth_fraction") == 1, a.evidence
    # the recommendation cites the same facts, in the same words
    cited = {(e.metric, e.value) for e in a.recommendations[0].evidence}
    assert (verdicts[0].metric, verdicts[0].value) in cited
    assert len({(e.metric, e.value) for e in a.evidence}) == len(a.evidence), a.evidence


# -- the collector's raw output ---------------------------------------------------------------------------------------

# The counters note of a held-out profile (perf stat -x , in a VM, events with perf's ':u' modifier), as stored.
_PERF_NOTE = ("perf produced no counters: 630.55,msec,task-clock:u,630550252,100.00,0.870,CPUs utilized\n"
              "<not supported>,,cycles:u,0,100.00,,\n<not supported>,,instructions:u,0,100.00,,\n"
              "<not supported>,,cache-references:u,0,100.00,,\n<not supported>,,cache-misses:u,0,100.00,,\n"
              "<not supported>,,branch-misses:u,0,100.00,,")


def test_unavailable_counters_are_said_in_one_line_not_pasted():
    """Held-out: the note pasted perf's multi-line CSV (`<not supported>,,cycles:u,0,100.00,,`) verbatim."""
    a = RulesAnalyst().analyze(_report(counters_note=_PERF_NOTE))
    (note,) = [n for n in a.notes if n.startswith("hardware counters unavailable")]
    assert "\n" not in note and ",," not in note and ":u" not in note, note
    assert "cycles, instructions, cache-references, cache-misses, branch-misses as <not supported>" in note, note
    assert "counted only task-clock" in note, note
    # a note that is not perf's CSV is kept, on one line
    other = RulesAnalyst().analyze(_report(counters_note="perf not found on PATH;\n install linux-perf"))
    assert "hardware counters unavailable: perf not found on PATH; install linux-perf" in other.notes, other.notes


# -- ranking and the verdict when no measurement classifies the candidate -----------------------------------------------

_ROWNORM = """#include <cmath>
#include <cstdint>
#include <vector>
extern "C" void l2_rows(const float* xp, float* yp, int64_t R, int64_t C) {
    #pragma omp parallel for
    for (int64_t r = 0; r < R; ++r) {
        const float* row = xp + r * C;
        float* out = yp + r * C;
        std::vector<float> sq(C);
        for (int64_t k = 0; k < C; ++k) {
            sq[k] = row[k] * row[k];
        }
        float ss = 0.0f;
        for (int64_t k = 0; k < C; ++k) {
            ss += sq[k];
        }
        const float inv = 1.0f / std::sqrt(ss);
        for (int64_t k = 0; k < C; ++k) {
            out[k] = row[k] * inv;
        }
    }
}
"""


def test_a_pass_merge_found_in_the_code_outranks_a_compiler_flag_and_the_verdict_says_what_is_known(tmp_path):
    """Held-out: a row-wise L2 norm, parallel over rows, squaring into a scratch row, summing it, scaling. It got
    "unknown (no rule found a clear limit in this profile)" and "Compile for this CPU's vector width" first, the merge
    of the two passes second: wider vectors pay in compute-bound loops, which nothing measured showed."""
    code = _candidate(_ROWNORM)
    compiler = _vectorizer_report(tmp_path, _ROWNORM)
    assert [r.vector_bytes for r in compiler.builds[0].loops if r.vectorized] == [16, 16, 16], compiler  # no -march
    report = _report(threads=2, median_us=3000.0, eager=2.04, compiled=0.97, bandwidth=0.083,
                     counters_note=_PERF_NOTE)
    a = RulesAnalyst().analyze(report, code=code, compiler=compiler)
    titles = [r.title for r in a.recommendations]
    assert titles[0] == "Merge the 2 passes into one loop", str(a)
    assert titles.index("Compile for this CPU's vector width") > 0, str(a)
    assert not any(re.search(r"omp parallel|paralleli[sz]e", f"{r.title} {r.action}") for r in a.recommendations)
    # no measurement decides the class; the verdict says what the evidence shows and which measurement would decide
    assert a.bottleneck == "unknown"
    assert "no rule found a clear limit" not in a.bottleneck_why, a.bottleneck_why
    assert "8% of the measured copy bandwidth" in a.bottleneck_why and "(sq)" in a.bottleneck_why, a.bottleneck_why
    assert "perf" in a.bottleneck_why and "<not supported>" in a.bottleneck_why, a.bottleneck_why
    # where the code itself is compute-bound (a scalar exp in the loop), wider vectors keep their weight
    exp_code = code.replace("sq[k] = row[k] * row[k];", "sq[k] = std::exp(row[k]);")
    exp_compiler = compiler.model_copy(update={"builds": [compiler.builds[0].model_copy(update={"scalar_math": ["expf"]})]})
    hot = RulesAnalyst().analyze(report, code=exp_code, compiler=exp_compiler)
    assert hot.bottleneck == "compute-bound", str(hot)
    hot_titles = [r.title for r in hot.recommendations]
    assert hot_titles.index("Compile for this CPU's vector width") < hot_titles.index("Merge the 2 passes into one loop")


_GEMM = """#include <cstdint>
extern "C" void mm(const float* pa, const float* pb, float* pc, int64_t M, int64_t K, int64_t N) {
    #pragma omp parallel for collapse(2)
    for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
            float dot = 0.0f;
            for (int64_t k = 0; k < K; ++k) {
                dot += pa[i * K + k] * pb[k * N + j];
            }
            pc[i * N + j] = dot;
        }
    }
}
"""


@pytest.mark.parametrize("cpp, first", [(_COLSUM, "Make the inner loop unit-stride"),
                                        (_GEMM, "Tile the matmul loops and order them i-k-j")])
def test_memory_bound_is_not_claimed_on_a_tiny_bandwidth_fraction(cpp, first):
    """Held-out: "memory-bound" at 0.0139 (colsum) and 0.0006 (naive matmul) of the measured copy bandwidth, from the
    code's shape alone. The advice stays; the class is claimed only where the timing leaves memory possible."""
    code = _candidate(cpp)
    tiny = RulesAnalyst().analyze(_report(threads=4, eager=0.05, bandwidth=0.0139, compute=0.02), code=code)
    assert tiny.recommendations[0].title == first, str(tiny)
    assert tiny.bottleneck != "memory-bound", str(tiny)
    assert "1.4% of the measured copy bandwidth" in tiny.bottleneck_why, tiny.bottleneck_why
    assert "2% of the measured matmul rate" in tiny.bottleneck_why, tiny.bottleneck_why
    assert "the code shows" in tiny.bottleneck_why and "perf" in tiny.bottleneck_why, tiny.bottleneck_why
    # a fraction the access pattern can explain keeps the class
    busy = RulesAnalyst().analyze(_report(threads=4, eager=0.05, bandwidth=0.2), code=code)
    assert busy.bottleneck == "memory-bound" and busy.recommendations[0].title == first, str(busy)
