"""The analyst on real builds and real profiles (issue 20), CPU backend: profile_kernel then summarize_profile.

Each candidate in tests/candidates/analyst/ is built by g++ (with its vectorizer report), verified, timed
against eager and profiled by the real tools; summarize_profile then reads the stored profile, the
compiler's report and the profiled code. Its first recommendation must be the known right one, and no
recommendation may propose what the candidate already has. The softmax also goes through a real MCP
client and server (stdio), as an agent would.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kforge.server.catalog import problem_reference

from .conftest import stdio_session

pytestmark = pytest.mark.anyio

CANDIDATES = Path(__file__).parent / "candidates" / "analyst"
ADVISES = {"parallel": r"omp parallel|paralleli[sz]e", "simd": r"omp simd", "fusion": r"\bfuse\b|fusion"}
CASES = {  # candidate: (reference, right first title, features it has that must not be advised)
    "cpu_serial_loop": ("ref_leaky", "Parallelize the outer loop", set()),
    "cpu_strided_inner": ("ref_colsum", "Make the inner loop unit-stride", {"parallel"}),
    "cpu_softmax_scalar_exp": ("softmax", "Vectorize the exp() calls", {"parallel", "simd"}),
    "cpu_gemm_untiled": ("matmul", "Tile the matmul loops and order them i-k-j", {"parallel"}),
    "cpu_launch_bound": ("ref_affine_chain", "Fuse the small ops into one kernel", set()),
}


def _reference(name: str) -> str:
    path = CANDIDATES / f"{name}.py"
    return path.read_text() if path.exists() else problem_reference(name)


def _assert_advice(summary: dict, first: str, has: set[str]) -> None:
    analysis = summary["analysis"]
    recs = analysis["recommendations"]
    assert recs and recs[0]["title"] == first, analysis
    for feature in has:
        for r in recs:
            assert not re.search(ADVISES[feature], f"{r['title']} {r['action']}", re.I), (feature, r)
    assert not any("steadier run" in n for n in analysis["notes"]), analysis["notes"]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    from kforge.tools.context import ToolContext

    return ToolContext(home=tmp_path_factory.mktemp("analyst-home"))


@pytest.mark.parametrize("name", list(CASES))
async def test_profile_then_summary_gives_the_right_first_advice(ctx, name):
    from kforge.tools.profile import profile_kernel
    from kforge.tools.summarize import summarize_profile

    reference, first, has = CASES[name]
    prof = await profile_kernel(ctx, "cpu", _reference(reference), (CANDIDATES / f"{name}.py").read_text(),
                                baselines=("eager",), budget_s=0.6, hardware_counters=False)
    assert prof.ok and prof.output_correct, prof.failure
    if name != "cpu_launch_bound":
        (report,) = prof.compiler_reports  # the vectorizer's report came with the normal build
        assert report.compiler == "gcc" and report.loops, report
    summary = await summarize_profile(ctx, profile_id=prof.profile_id)  # no code passed: the profile kept it
    _assert_advice(summary.model_dump(mode="json"), first, has)
    if name == "cpu_softmax_scalar_exp":
        assert "expf" in prof.compiler_reports[0].scalar_math
        top = summary.analysis.recommendations[0]
        assert any(e.source == "compiler" for e in top.evidence) and top.confidence == "high"
    if name != "cpu_launch_bound":
        assert summary.analysis.recommendations[0].where.startswith("line ")


async def test_softmax_through_an_mcp_client(kforge_home):
    args = {"backend": "cpu", "reference_code": problem_reference("softmax"),
            "candidate_code": (CANDIDATES / "cpu_softmax_scalar_exp.py").read_text()}
    async with stdio_session(kforge_home) as client:
        result = await client.call_tool("profile_kernel", {**args, "baselines": ["eager"], "budget_s": 0.6,
                                                           "hardware_counters": False})
        assert not result.is_error, result.content[0].text
        prof = result.structured_content
        answer = await client.call_tool("summarize_profile", {"profile_id": prof["profile_id"]})
    assert not answer.is_error, answer.content[0].text
    assert prof["compiler_reports"][0]["scalar_math"] == ["expf"]
    _assert_advice(answer.structured_content, "Vectorize the exp() calls", {"parallel", "simd"})
    assert "Vectorize the exp() calls" in answer.content[0].text
