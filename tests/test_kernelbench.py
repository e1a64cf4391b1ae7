"""KernelBench problems by name (`problem="kernelbench:level1/19_ReLU"`), from a checkout the user configures.

The checkouts here are small trees of KernelBench's shape, written by the tests (KernelBench's own files are
never copied into KForge); the last test reads a real checkout where one was materialized (.kb/).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kforge.server.catalog import Problems, UnknownProblem, problem_reference
from kforge.server.settings import ConfigError, load_settings

from .conftest import stdio_session

pytestmark = pytest.mark.anyio

RELU = problem_reference("relu")  # a KernelBench-format file, as a checkout holds them


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A clone's shape: <root>/KernelBench/level1/19_ReLU.py and a level2 problem."""
    root = tmp_path / "KernelBench-clone"
    (root / "KernelBench" / "level1").mkdir(parents=True)
    (root / "KernelBench" / "level2").mkdir()
    (root / "KernelBench" / "level1" / "19_ReLU.py").write_text(RELU)
    (root / "KernelBench" / "level1" / "2_Other.py").write_text(RELU.replace("relu", "abs"))
    (root / "KernelBench" / "level2" / "1_Conv2D_ReLU_BiasAdd.py").write_text(RELU)
    return root


def test_names_and_spellings(checkout):
    problems = Problems(checkout)
    assert problems.names()[-3:] == ["kernelbench:level1/2_Other", "kernelbench:level1/19_ReLU",
                                     "kernelbench:level2/1_Conv2D_ReLU_BiasAdd"]
    for spelling in ("kernelbench:level1/19_ReLU", "kernelbench:level1/19", "kernelbench:level1/19_ReLU.py",
                     "kernelbench:1/19_relu"):
        assert problems.reference(spelling) == RELU, spelling
    assert Problems(checkout / "KernelBench").reference("kernelbench:level1/19") == RELU  # its KernelBench/ folder too
    with pytest.raises(UnknownProblem, match=r"no KernelBench problem 'kernelbench:level1/19_Relux'.*closest: kernelbench:level1/19_ReLU"):
        problems.reference("kernelbench:level1/19_Relux")
    with pytest.raises(UnknownProblem, match="no KernelBench checkout is configured.*KFORGE_KERNELBENCH_DIR"):
        Problems().reference("kernelbench:level1/19_ReLU")
    with pytest.raises(UnknownProblem, match="the pack has: .*relu"):
        problems.reference("reluu")


def test_a_path_that_is_no_checkout_stops_the_server_at_start(tmp_path, monkeypatch):
    monkeypatch.setenv("KFORGE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("KFORGE_KERNELBENCH_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match=f"KFORGE_KERNELBENCH_DIR: .*{tmp_path} is not a KernelBench checkout"):
        load_settings()


async def test_tools_and_resources_resolve_kernelbench_names(checkout, tmp_path, candidate):
    async with stdio_session(tmp_path, KFORGE_KERNELBENCH_DIR=str(checkout), KFORGE_WARM_WORKERS="0") as client:
        names = json.loads((await client.read_resource("kforge://problems")).contents[0].text)
        assert "relu" in names and "kernelbench:level1/19_ReLU" in names
        text = (await client.read_resource("kforge://problems/kernelbench:level1/19_ReLU")).contents[0].text
        assert text == RELU
        r = await client.call_tool("verify_against_reference", {"backend": "cpu", "problem": "kernelbench:level1/19",
                                                                "candidate_code": candidate("relu_python"), "trials": 2})
        assert not r.is_error and r.structured_content["correct"], r.content[0].text
        r = await client.call_tool("verify_against_reference", {"backend": "cpu", "problem": "kernelbench:level1/91_ReLU",
                                                                "candidate_code": candidate("relu_python")})
        assert r.is_error and "no KernelBench problem 'kernelbench:level1/91_ReLU'" in r.content[0].text


async def test_without_a_checkout_the_error_says_what_to_configure(tmp_path, candidate):
    async with stdio_session(tmp_path, KFORGE_WARM_WORKERS="0") as client:
        r = await client.call_tool("verify_against_reference", {"backend": "cpu", "problem": "kernelbench:level1/23_Softmax",
                                                                "candidate_code": candidate("relu_python")})
        assert r.is_error and "KFORGE_KERNELBENCH_DIR" in r.content[0].text and "KernelBench" in r.content[0].text


REAL = Path(__file__).resolve().parents[1] / ".kb"


@pytest.mark.skipif(not (REAL / "KernelBench" / "level1").is_dir(),
                    reason="no KernelBench checkout materialized at .kb/ (bash bench/prepare_kernelbench.sh)")
def test_a_real_checkout():
    problems = Problems(REAL)
    names = problems.names()
    assert "kernelbench:level1/23_Softmax" in names and sum(n.startswith("kernelbench:level1/") for n in names) == 100
    assert "torch.softmax" in problems.reference("kernelbench:level1/23_Softmax")
