"""End to end over stdio: the MCP SDK's client drives a real `kforge serve` process."""

from __future__ import annotations

import json
import time

import pytest

from .conftest import CANDIDATES, stdio_session

pytestmark = pytest.mark.anyio

TOOLS = {"compile_kernel", "verify_against_reference", "profile_kernel", "summarize_profile", "list_backends"}


def data(result) -> dict:
    assert not result.is_error, result.content[0].text
    return result.structured_content


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_tools_resources_and_backends(kforge_home, mode):
    async with stdio_session(kforge_home, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert TOOLS <= set(tools)
        for name in TOOLS:
            assert tools[name].output_schema, f"{name} publishes no output schema"
        assert "backend" in tools["compile_kernel"].input_schema["properties"]
        backends = data(await client.call_tool("list_backends", {}))["backends"]
        cpu = next(b for b in backends if b["backend"] == "cpu")
        assert cpu["ok"] and "torch" in cpu["versions"]
        example = (await client.read_resource("kforge://examples/cpu")).contents[0].text
        assert "class ModelNew" in example and "class Model(" in example
        problems = json.loads((await client.read_resource("kforge://problems")).contents[0].text)
        assert "relu" in problems
        unknown = await client.call_tool("compile_kernel", {"backend": "metal", "candidate_code": "x = 1"})
        assert unknown.is_error and "unknown backend 'metal'" in unknown.content[0].text


async def test_honest_candidate_end_to_end(kforge_home, cpu_example):
    ref, cand = cpu_example["reference"], cpu_example["candidate"]
    progress: list[tuple[float, str | None]] = []

    async def on_progress(done, total, message):
        progress.append((done, message))

    async with stdio_session(kforge_home) as client:
        built = data(await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": cand}))
        assert built["ok"] and built["builds"][0]["name"] == "fused_relu_scale_bias"
        assert built["builds"][0]["functions"] == ["fused_relu_scale_bias"]

        again = data(await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": cand, "use_store": False}))
        assert again["ok"] and again["from_cache"] and again["build_seconds"] < 10

        verdict = data(await client.call_tool("verify_against_reference", {
            "backend": "cpu", "reference_code": ref, "candidate_code": cand}, progress_callback=on_progress))
        assert verdict["correct"] and len(verdict["trials"]) == 5
        assert len({t["seed"] for t in verdict["trials"]}) == 5, "every trial must use its own seed"
        out = verdict["trials"][0]["outputs"][0]
        assert out["expected"]["shape"] == [512, 2048] and out["got"]["dtype"] == "float32"
        assert out["max_abs_error"] <= 1e-4 and out["mismatches"] == 0
        assert verdict["tolerances"][0]["dtype"] == "float32" and verdict["tolerances"][0]["why"]
        assert verdict["weights"] == {"copied": 2, "reference_total": 2, "unmatched": []}
        assert progress and progress[-1][1] == "done"

        prof = data(await client.call_tool("profile_kernel", {
            "backend": "cpu", "reference_code": ref, "candidate_code": cand, "budget_s": 0.5}))
        assert prof["ok"] and prof["output_correct"]
        report = prof["report"]
        assert report["candidate"]["samples"] >= 2 and report["candidate"]["median_us"] > 0
        names = [b["name"] for b in report["baselines"]]
        assert names == ["eager", "torch.compile"]
        eager = report["baselines"][0]
        assert eager["speedup"] == pytest.approx(eager["timing"]["median_us"] / report["candidate"]["median_us"], rel=1e-3)
        assert eager.get("reused_after_s") is None  # timed in this run
        lo, hi = eager["speedup_ci"]
        assert lo <= eager["speedup"] <= hi and eager["comparison"] in ("faster", "slower", "no measurable difference")
        assert report["candidate"]["rounds"] in (3, 5) and report["candidate"]["threads"] >= 1
        assert report["candidate"]["q1_us"] <= report["candidate"]["median_us"] <= report["candidate"]["q3_us"]
        assert {c["name"] for c in prof["checks"]} >= {"probe_memo", "stable_timing", "timed_outputs"}
        # The next profile times eager again (the canary) and may reuse torch.compile only while eager agrees.
        again = data(await client.call_tool("profile_kernel", {
            "backend": "cpu", "reference_code": ref, "candidate_code": cand, "budget_s": 0.5}))
        eager2, compiled2 = again["report"]["baselines"]
        assert eager2.get("reused_after_s") is None
        if compiled2.get("reused_after_s") is not None:
            assert compiled2["timing"] == report["baselines"][1]["timing"]
            assert abs(eager2["timing"]["median_us"] / eager["timing"]["median_us"] - 1) <= 0.02
        fresh = data(await client.call_tool("profile_kernel", {
            "backend": "cpu", "reference_code": ref, "candidate_code": cand, "budget_s": 0.5, "fresh_baselines": True}))
        assert [b.get("reused_after_s") for b in fresh["report"]["baselines"]] == [None, None]
        custom = [op for op in report["ops"] if op["is_custom"]]
        assert custom and custom[0]["name"] == "kforge::fused_relu_scale_bias.fused_relu_scale_bias"
        assert report["custom_share"] > 0.5
        assert report["problem_bytes"] == 2 * 512 * 2048 * 4  # x in, y out (fp32)
        assert report["device"]["peak_bandwidth_gbs"] > 0
        assert report["achieved_bandwidth_gbs"] == pytest.approx(
            report["problem_bytes"] / report["candidate"]["median_us"] / 1e3, rel=1e-2)
        assert 0 < report["bandwidth_fraction"] == pytest.approx(
            report["achieved_bandwidth_gbs"] / report["device"]["peak_bandwidth_gbs"], rel=1e-2)

        stored = json.loads((await client.read_resource(f"kforge://profiles/{prof['profile_id']}")).contents[0].text)
        assert stored["profile_id"] == prof["profile_id"]
        trace_uri = next(a for a in prof["artifacts"] if a.endswith("/trace.json"))
        trace = json.loads((await client.read_resource(trace_uri)).contents[0].text)
        assert any("fused_relu_scale_bias" in str(e.get("name")) for e in trace["traceEvents"])
        table_uri = next(a for a in prof["artifacts"] if a.endswith("/torch_table.txt"))
        table = (await client.read_resource(table_uri)).contents[0].text
        pasted = data(await client.call_tool("summarize_profile", {"profile_text": table}))
        assert pasted["source"] == "torch.profiler" and "fused_relu_scale_bias" in table

        summary = data(await client.call_tool("summarize_profile", {"profile_id": prof["profile_id"], "candidate_code": cand}))
        assert summary["analysis"]["bottleneck"] and summary["analysis"]["recommendations"]

        # The problem's history: the verify and the profile above, with the best trusted speedup so far.
        sha = verdict["spec"]["reference_sha256"]
        index = json.loads((await client.read_resource("kforge://history")).contents[0].text)
        assert any(p["reference_sha256"] == sha and p["entries"] >= 2 for p in index)
        history = json.loads((await client.read_resource(f"kforge://history/{sha}")).contents[0].text)
        tools_seen = [e["tool"] for e in history["entries"]]
        assert "verify_against_reference" in tools_seen and "profile_kernel" in tools_seen
        profiled = [e for e in history["entries"] if e["profile_id"] == prof["profile_id"]]
        assert profiled and profiled[0]["speedup_eager"] == pytest.approx(eager["speedup"])
        if prof["speedup_trusted"]:
            assert history["best"]["speedup_eager"] >= profiled[0]["speedup_eager"]

        prompt = await client.get_prompt("optimization_pass", {"backend": "cpu", "problem": ref, "candidate_code": cand,
                                                              "profile_id": prof["profile_id"]})
        assert "What the profile says" in prompt.messages[0].content.text


async def test_wrong_candidate_is_rejected_with_the_mismatch(kforge_home, cpu_example, candidate):
    async with stdio_session(kforge_home) as client:
        verdict = data(await client.call_tool("verify_against_reference", {
            "backend": "cpu", "reference_code": cpu_example["reference"],
            "candidate_code": candidate("wrong_forgets_bias")}))
    assert verdict["ok"] and not verdict["correct"]
    assert all(not t["correct"] for t in verdict["trials"])
    out = verdict["trials"][0]["outputs"][0]
    assert out["mismatches"] > 0 and out["first_mismatches"]
    first = out["first_mismatches"][0]
    assert abs(first["got"] - first["expected"]) > 1e-4
    assert "differ beyond" in out["problems"][0]


@pytest.mark.parametrize("name, kind, line, text", [
    ("syntax_error", "syntax_error", 6, "expected ':'"),
    ("import_error", "import_error", 2, "kforge_no_such_module"),
    ("no_modelnew", "interface_error", None, "ModelNew"),
    ("cpp_error", "build_error", 8, "undeclared_identifier"),
])
async def test_bad_candidates_are_located(kforge_home, name, kind, line, text):
    async with stdio_session(kforge_home) as client:
        result = data(await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": (CANDIDATES / f"{name}.py").read_text()}))
    assert not result["ok"]
    failure = result["failure"]
    assert failure["kind"] == kind and text in failure["message"]
    assert failure.get("line") == line
    if kind == "build_error":
        err = result["diagnostics"][0]
        assert err["severity"] == "error" and err["line"] == 8 and "undeclared_identifier" in err["code_line"]
        assert err["origin"].startswith("main.cpp:")


async def test_chatty_candidate_does_not_corrupt_stdio(kforge_home, cpu_example, candidate):
    async with stdio_session(kforge_home) as client:
        verdict = data(await client.call_tool("verify_against_reference", {
            "backend": "cpu", "reference_code": cpu_example["reference"], "candidate_code": candidate("chatty"),
            "trials": 2}))
        assert verdict["correct"]
        assert (await client.call_tool("list_backends", {})).structured_content["backends"]


async def test_store_survives_restart(tmp_path, cpu_example, candidate):
    args = {"backend": "cpu", "reference_code": cpu_example["reference"], "candidate_code": candidate("chatty"), "trials": 2}
    async with stdio_session(tmp_path) as client:
        answer = await client.call_tool("verify_against_reference", args)
        first = data(answer)
        prof = data(await client.call_tool("profile_kernel", {**args, "baselines": ["eager"], "budget_s": 0.2}))
        del prof["report"]["ops"]
    assert not first["from_store"] and "result store" not in answer.content[0].text
    async with stdio_session(tmp_path) as client:  # a new server process on the same data directory
        answer = await client.call_tool("verify_against_reference", args)
        second = data(answer)
        stored = json.loads((await client.read_resource(f"kforge://profiles/{prof['profile_id']}")).contents[0].text)
        summary = data(await client.call_tool("summarize_profile", {"profile_id": prof["profile_id"]}))
    assert second["from_store"] and second["correct"]
    # Its text says where the answer came from, when it was made and how to run it again.
    text = answer.content[0].text
    assert "Answered from the result store, not run now" in text and "use_store=false" in text, text
    assert f"which took {first['seconds']:.1f} s" in text and "UTC" in text and " ago)" in text, text
    assert time.time() - 1800 < second["stored_at"] <= time.time()
    assert [t["seed"] for t in second["trials"]] == [t["seed"] for t in first["trials"]]
    assert stored["report"]["candidate"] == prof["report"]["candidate"]
    assert summary["profile_id"] == prof["profile_id"]


async def test_a_stored_compile_says_so_and_claims_no_build(kforge_home, cpu_example):
    code = cpu_example["candidate"]
    async with stdio_session(kforge_home) as client:
        fresh = await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": code, "use_store": False})
        answer = await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": code})
    assert not data(fresh)["from_store"] and "result store" not in fresh.content[0].text
    built, text = data(answer), answer.content[0].text
    assert built["ok"] and built["from_store"] and built["stored_at"] <= time.time()
    assert text.startswith("Built OK (stored answer, nothing built now)"), text
    assert "fresh build" not in text and "from cache" not in text and "Pass use_store=false to build it again" in text


async def test_every_backend_has_a_complete_example(kforge_home):
    async with stdio_session(kforge_home) as client:
        for backend in ("cpu", "cuda", "triton"):
            text = (await client.read_resource(f"kforge://examples/{backend}")).contents[0].text
            assert "class Model(" in text and "def get_inputs" in text and "class ModelNew" in text, backend
