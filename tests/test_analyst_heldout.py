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
from kforge.profilers.compiler_report import CompilerFacts, CompilerReport, LoopRemark, imported_math
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
