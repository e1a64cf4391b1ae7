"""The generation agent's prompts and the resources that let it resume: through the SDK's in-memory client."""

from __future__ import annotations

import json

import pytest

from mcp import Client

from kforge.resources import templates
from kforge.server.app import build_server
from kforge.server.settings import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture
def server(tmp_path):
    return build_server(Settings(home=tmp_path))


async def test_prompts_are_listed_with_their_arguments(server):
    async with Client(server) as client:
        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
    assert set(prompts) == {"functional_pass", "optimization_pass"}
    required = {a.name for a in prompts["optimization_pass"].arguments if a.required}
    assert required == {"backend", "problem", "candidate_code"}


async def test_functional_pass_carries_example_problem_and_feedback(server):
    async with Client(server) as client:
        got = await client.get_prompt("functional_pass", {"backend": "cpu", "problem": "relu",
                                                          "feedback": "line 12: error: 'x' was not declared"})
    text = got.messages[0].content.text
    assert "functional pass" in text and "## The problem `relu`\n\n```python" in text
    assert "torch.relu(x)" in text                            # the pack's reference
    assert "fused_relu_scale_bias" in text                    # the cpu backend's verified example
    assert "line 12: error: 'x' was not declared" in text
    assert "{{" not in text and "{%" not in text


async def test_cross_platform_transfer_and_inline_reference(server):
    reference = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
    async with Client(server) as client:
        got = await client.get_prompt("functional_pass", {
            "backend": "triton", "problem": reference, "transfer_backend": "cuda",
            "transfer_code": "__global__ void twice(float* x) {}"})
    text = got.messages[0].content.text
    assert "return x * 2" in text and "`cuda` to port" in text and "__global__ void twice" in text
    assert "@triton.jit" in text


async def test_optimization_pass_without_a_stored_profile_says_so(server):
    async with Client(server) as client:
        got = await client.get_prompt("optimization_pass", {"backend": "cpu", "problem": "relu",
                                                            "candidate_code": "class ModelNew: pass",
                                                            "profile_id": "nope"})
    text = got.messages[0].content.text
    assert "optimization pass" in text and "profile 'nope' could not be read" in text
    assert "kforge://history/relu" in text


async def test_devices_and_empty_history_resources(server):
    async with Client(server) as client:
        devices = json.loads((await client.read_resource("kforge://devices")).contents[0].text)
        assert any(b["backend"] == "cpu" for b in devices["backends"])
        assert devices["measured_ceilings"] == {} and "kforge doctor" in devices["note"]
        assert json.loads((await client.read_resource("kforge://history")).contents[0].text) == []


def test_every_template_renders_only_what_it_declares():
    assert {"analyst_request.md.j2", "analyst_system.md.j2", "functional_pass.md.j2",
            "optimization_pass.md.j2"} <= set(templates.template_names())
    assert templates.variables("functional_pass.md.j2") >= {"backend", "reference", "example_candidate", "feedback"}
