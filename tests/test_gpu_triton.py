"""The Triton backend on a real GPU (skipped without one; scripts/run_gpu_tests.sh runs it)."""

from __future__ import annotations

import pytest

from .conftest import stdio_session, stored_once_added

pytestmark = [pytest.mark.anyio, pytest.mark.gpu]


def data(result) -> dict:
    assert not result.is_error, result.content[0].text
    return result.structured_content


async def test_triton_on_gpu(kforge_home, candidate):
    args = {"backend": "triton", "problem": "relu"}
    async with stdio_session(kforge_home) as client:
        good = data(await client.call_tool("verify_against_reference", {**args, "candidate_code": candidate("example_triton")}))
        assert good["correct"] and good["trials"][0]["outputs"][0]["got"]["device"].startswith("cuda")
        assert not any("interpreter" in w for w in good["warnings"])
        [kernel] = good["compile"]["jit_kernels"]
        assert kernel["kernel"] == "relu_kernel" and kernel["registers"] > 0 and kernel["num_warps"] >= 1
        assert kernel["num_stages"] >= 1 and kernel["local_bytes"] == 0 and kernel["arch"].startswith("sm_")

        built = data(await client.call_tool("compile_kernel", {**args, "candidate_code": candidate("example_triton")}))
        assert built["ok"] and built["jit_kernels"] == good["compile"]["jit_kernels"], built

        wrong = data(await client.call_tool("verify_against_reference", {**args, "candidate_code": candidate("triton_wrong")}))
        assert not wrong["correct"]

        broken = data(await client.call_tool("verify_against_reference", {**args, "candidate_code": candidate("triton_compile_error"), "trials": 1}))
        failure = broken["failure"]
        assert failure["kind"] == "build_error" and failure["line"] == 12, failure
        assert failure["diagnostics"][0]["source"] == "triton"

        prof = data(await client.call_tool("profile_kernel", {**args, "candidate_code": candidate("example_triton"), "budget_s": 1.0}))
        report = prof["report"]
        own = [op for op in report["ops"] if op["is_custom"]]
        assert own and own[0]["name"].startswith("relu_kernel") and report["custom_share"] > 0.5
        timed = {b["name"] for b in report["baselines"] if b.get("timing")}
        pending = {b["name"] for b in report["baselines"] if b.get("pending")}
        assert timed | pending == {"eager", "torch.compile"} and "eager" in timed, report["baselines"]
        if pending:  # the problem's warm-up was still compiling: the baseline is added to the stored profile
            stored = await stored_once_added(client, prof["profile_id"], "torch.compile")
            assert {b["name"] for b in stored["report"]["baselines"] if b.get("timing")} == {"eager", "torch.compile"}
        assert [k["kernel"] for k in prof["kernel_resources"]] == ["relu_kernel"]
