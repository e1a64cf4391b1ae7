"""End to end over streamable HTTP on loopback, with the MCP SDK's client."""

from __future__ import annotations

import subprocess

import pytest

from .conftest import kforge_command, server_env

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_http_compile_and_verify(http_server, cpu_example, candidate, mode):
    seen = []

    async def on_progress(done, total, message):
        seen.append(message)

    async with http_server.session(mode=mode) as client:
        built = await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": candidate("syntax_error")})
        assert not built.is_error and built.structured_content["failure"]["line"] == 6
        assert built.content[0].text.startswith("Compile failed: syntax_error")
        verdict = await client.call_tool("verify_against_reference", {
            "backend": "cpu", "problem": "relu", "candidate_code": candidate("relu_python"), "trials": 2,
            "use_store": False}, progress_callback=on_progress)
        assert verdict.structured_content["correct"], verdict.content[0].text
        assert "trial 2 of 2 compared with the reference" in seen, seen


async def test_http_bad_request_is_a_tool_error(http_server, candidate):
    async with http_server.session() as client:
        both = await client.call_tool("verify_against_reference", {
            "backend": "cpu", "candidate_code": candidate("relu_python")})
        assert both.is_error and "pass exactly one of reference_code" in both.content[0].text
        missing = await client.call_tool("summarize_profile", {"profile_id": "doesnotexist"})
        assert missing.is_error and "no stored profile 'doesnotexist'" in missing.content[0].text


def test_http_refuses_to_listen_beyond_loopback(tmp_path):
    proc = subprocess.run([*kforge_command(), "serve", "--transport", "http", "--host", "0.0.0.0", "--port", "1"],
                          env=server_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "refusing to serve HTTP on 0.0.0.0" in proc.stderr
