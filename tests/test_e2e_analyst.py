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
    "cpu_multipass_chain": ("ref_scale_shift_relu", "Merge the 3 passes into one loop", {"parallel", "simd"}),
    "cpu_branchy_loop": ("ref_signed_sqrt", "Make the loop at line 23 vectorize", {"parallel"}),
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


_PROFILES: dict[tuple[str, str], object] = {}  # (home, candidate) -> its profile: each candidate is profiled once


async def _profiled(ctx, name: str):
    from kforge.tools.profile import profile_kernel
    from kforge.tools.requests import ProfileRequest

    key = (str(ctx.home), name)
    if key not in _PROFILES:
        prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=_reference(CASES[name][0]),
                                                        candidate_code=(CANDIDATES / f"{name}.py").read_text(),
                                                        baselines=("eager",), budget_s=0.6, hardware_counters=False))
        assert prof.ok and prof.output_correct, prof.failure
        _PROFILES[key] = prof
    return _PROFILES[key]


@pytest.mark.parametrize("name", list(CASES))
async def test_profile_then_summary_gives_the_right_first_advice(ctx, name):
    from kforge.tools.summarize import summarize_profile

    _, first, has = CASES[name]
    prof = await _profiled(ctx, name)
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


# A model's answer: one piece of advice the softmax already follows (threads), one it needs (a vector exp),
# whose first sentence proposes the simd pragma that every loop already has.
MODEL_ANSWER = {"bottleneck": "compute-bound", "bottleneck_why": "scalar expf",
                "recommendations": [
                    {"title": "Parallelize the rows", "action": "Add #pragma omp parallel for on the row loop."},
                    {"title": "Use a vector exp", "action": "Add #pragma omp simd to the exp loop. Compile with "
                     "-ffast-math -march=native so expf becomes libmvec's vector exp.", "confidence": "high"}]}


def _assert_same_facts_as_the_rules(user: str, prof) -> None:
    """The model's request holds the compiler's report, the numbered source, the measurements and the rules' findings."""
    code = (CANDIDATES / "cpu_softmax_scalar_exp.py").read_text().splitlines()
    exp_line = next(n for n, line in enumerate(code, 1) if "std::exp" in line)
    assert f"{exp_line:4d}  {code[exp_line - 1]}" in user
    assert '"scalar_math": [' in user and '"expf"' in user and '"vectorized": false' in user  # nm -D and the vectorizer
    assert f'"median_us": {prof.report.candidate.median_us}' in user and '"speedup"' in user  # the measurements
    assert "## The rules engine's findings" in user and "Vectorize the exp() calls" in user
    assert "Already in the code: do not recommend adding these" in user and "parallel (line 21" in user


def _assert_pruned(analysis: dict) -> None:
    recs = analysis["recommendations"]
    assert [r["title"] for r in recs] == ["Use a vector exp"], analysis
    assert recs[0]["action"].startswith("Compile with -ffast-math"), recs[0]  # the simd sentence was cut
    assert any("dropped 'Parallelize the rows'" in n for n in analysis["notes"]), analysis["notes"]


@pytest.mark.parametrize("api", ["anthropic", "openai"])
async def test_http_model_analysts_get_the_same_facts_and_the_same_rule(ctx, api, monkeypatch):
    import json

    from kforge.profilers.analyst.http import ModelConfig
    from kforge.tools.summarize import AnalystConfig, summarize_profile

    from .test_analyst_models import FakeModelServer

    prof = await _profiled(ctx, "cpu_softmax_scalar_exp")
    server = FakeModelServer()
    server.reply = json.dumps(MODEL_ANSWER)
    try:
        config = AnalystConfig(provider=api, model=ModelConfig(api=api, model="m", base_url=server.url,
                                                               api_key_env="KFORGE_TEST_KEY", timeout_s=30,
                                                               api_key="sk-test"))
        summary = await summarize_profile(ctx, analyst=config, profile_id=prof.profile_id)
    finally:
        server.close()
    body = server.requests[-1][2]
    content = body["messages"][0 if api == "anthropic" else 1]["content"]
    _assert_same_facts_as_the_rules(content if isinstance(content, str) else content[-1]["text"], prof)
    data = summary.model_dump(mode="json")
    assert data["analysis"]["provider"] == f"{api}:m"
    _assert_pruned(data["analysis"])


async def test_sampling_analyst_gets_the_same_facts_and_the_same_rule(ctx):
    import json

    from mcp import Client
    from mcp.types import CreateMessageResult, TextContent

    from kforge.server.app import build_server
    from kforge.server.settings import Settings

    prof = await _profiled(ctx, "cpu_softmax_scalar_exp")
    asked: list[str] = []

    async def client_model(context, params) -> CreateMessageResult:
        asked.append("".join(b.text for m in params.messages for b in m.content_as_list if b.type == "text"))
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text=json.dumps(MODEL_ANSWER)),
                                   model="client-model")

    server = build_server(Settings(home=ctx.home, analyst="sampling"))
    async with Client(server, sampling_callback=client_model) as client:
        result = await client.call_tool("summarize_profile", {"profile_id": prof.profile_id})
    assert not result.is_error, result.content[0].text
    _assert_same_facts_as_the_rules(asked[-1], prof)
    assert result.structured_content["analysis"]["provider"] == "sampling:client-model"
    _assert_pruned(result.structured_content["analysis"])
