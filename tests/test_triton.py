"""The Triton backend without a GPU: candidates verified under Triton's interpreter, no timing claimed."""

from __future__ import annotations

import pytest
import torch

from .conftest import stdio_session

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(torch.cuda.is_available(), reason="GPU present: see test_gpu_triton.py")]


async def test_triton_candidates_under_the_interpreter(kforge_home, candidate):
    args = {"backend": "triton", "problem": "relu", "trials": 2}
    async with stdio_session(kforge_home) as client:
        triton = next(b for b in (await client.call_tool("list_backends", {})).structured_content["backends"]
                      if b["backend"] == "triton")
        assert triton["ok"] and triton["mode"] == "interpreter" and triton["timing"] is False

        good = (await client.call_tool("verify_against_reference", {**args, "candidate_code": candidate("example_triton")})).structured_content
        assert good["correct"], good
        assert any("interpreter mode" in w for w in good["warnings"])

        wrong = (await client.call_tool("verify_against_reference", {**args, "candidate_code": candidate("triton_wrong")})).structured_content
        assert not wrong["correct"] and wrong["trials"][0]["outputs"][0]["mismatches"] > 0

        broken = (await client.call_tool("verify_against_reference", {**args, "candidate_code": candidate("triton_compile_error")})).structured_content
        assert not broken["correct"] and broken["failure"]["line"] == 12, broken["failure"]
        assert "undefined_bias" in broken["failure"]["message"]

        # Triton compiles at first launch: compile_kernel alone imports fine, with a problem it launches once.
        imported = (await client.call_tool("compile_kernel", {"backend": "triton", "candidate_code": candidate("triton_compile_error")})).structured_content
        assert imported["ok"] and imported["jit_kernels"] == []
        launched = (await client.call_tool("compile_kernel", {"backend": "triton", "problem": "relu", "candidate_code": candidate("triton_compile_error")})).structured_content
        assert not launched["ok"] and launched["failure"]["line"] == 12, launched
        fine = (await client.call_tool("compile_kernel", {"backend": "triton", "problem": "relu", "candidate_code": candidate("example_triton")})).structured_content
        assert fine["ok"] and fine["jit_kernels"] == []  # the interpreter compiles nothing to report

        timed = await client.call_tool("profile_kernel", {**args, "candidate_code": candidate("example_triton")})
        assert timed.is_error and "cannot be timed on this host" in timed.content[0].text
