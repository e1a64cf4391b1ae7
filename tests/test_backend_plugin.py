"""The backend seam is complete: a backend that a package registers through the `kforge.backends` entry point,
with no edit under tools/ or server/, gets every tool, the prompts and its example resource.

The package is tests/toy_backend: `kforge_toy.ToyCpuBackend`, a CPU-like device named `toycpu`, and a
`.dist-info` whose entry_points.txt registers it (the lightest real registration: what `pip install` leaves on
sys.path). Only the server's PYTHONPATH names it; its workers inherit that.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import stdio_session

pytestmark = pytest.mark.anyio

TOY = Path(__file__).parent / "toy_backend"
TOY_EXAMPLE = TOY / "kforge_toy" / "example"


def data(result) -> dict:
    assert not result.is_error, result.content[0].text
    return result.structured_content


def toy_path() -> str:
    return os.pathsep.join(p for p in (str(TOY), os.environ.get("PYTHONPATH")) if p)


async def test_a_plugged_in_backend_gets_every_tool_the_prompts_and_its_example(tmp_path):
    ref, cand = (TOY_EXAMPLE / "reference.py").read_text(), (TOY_EXAMPLE / "candidate.py").read_text()
    async with stdio_session(tmp_path, PYTHONPATH=toy_path()) as client:
        backends = {b["backend"]: b for b in data(await client.call_tool("list_backends", {}))["backends"]}
        assert backends["toycpu"]["ok"], backends["toycpu"]

        example = (await client.read_resource("kforge://examples/toycpu")).contents[0].text
        assert "class ModelNew" in example and "class Model(" in example and "twice_plus_one" in example

        built = data(await client.call_tool("compile_kernel", {"backend": "toycpu", "candidate_code": cand}))
        assert built["ok"] and built["builds"][0]["name"] == "toy_twice_plus_one"
        assert built["builds"][0]["functions"] == ["twice_plus_one"]

        verdict = data(await client.call_tool("verify_against_reference", {
            "backend": "toycpu", "reference_code": ref, "candidate_code": cand}))
        assert verdict["ok"] and verdict["correct"], verdict
        assert verdict["spec"]["backend"] == "toycpu"

        prof = data(await client.call_tool("profile_kernel", {
            "backend": "toycpu", "reference_code": ref, "candidate_code": cand, "budget_s": 0.5}))
        assert prof["ok"] and prof["output_correct"], prof
        report = prof["report"]
        assert report["backend"] == "toycpu" and report["candidate"]["median_us"] > 0
        assert [b["name"] for b in report["baselines"]] == ["eager", "torch.compile"]
        assert report["device"]["kind"] == "cpu"

        summary = data(await client.call_tool("summarize_profile", {"profile_id": prof["profile_id"],
                                                                   "candidate_code": cand}))
        assert summary["profile_id"] == prof["profile_id"] and summary["analysis"]["bottleneck"]

        functional = await client.get_prompt("functional_pass", {"backend": "toycpu", "problem": "relu"})
        text = functional.messages[0].content.text
        assert "toycpu" in text and "twice_plus_one" in text  # the backend's own example, not another's
        optimization = await client.get_prompt("optimization_pass", {
            "backend": "toycpu", "problem": ref, "candidate_code": cand, "profile_id": prof["profile_id"]})
        assert "What the profile says" in optimization.messages[0].content.text


def test_the_toy_backend_is_registered_only_through_its_entry_point():
    """Nothing in KForge names it: it is found through the `kforge.backends` group of its dist-info."""
    import subprocess
    import sys

    code = ("from kforge.backends import backend_names, example_dir; "
            "print('toycpu' in backend_names(), example_dir('toycpu'))")
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    plugged = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": toy_path()}).stdout.split()
    assert plain == ["False", "None"]
    assert plugged == ["True", str(TOY_EXAMPLE)]
    here = Path(__file__).parents[1]
    for part in ("tools", "server", "resources", "backends", "profilers"):
        for path in (here / part).rglob("*.py"):
            assert "toycpu" not in path.read_text(), f"{path} names the toy backend"
