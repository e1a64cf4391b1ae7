"""Each GPU of a real host as a device of its own, through the MCP client (skipped without a GPU; run by
scripts/run_gpu_tests.sh). The same rules on fake GPU lists, without a GPU: tests/test_gpu_placement.py.

The reference and the candidate check, at import in their own workers, that they run on the GPU the call asked
for (its uuid) and see only it: a verdict of `correct` proves where both sides ran, not only what the result
says. Small problem, eager baseline only, no Nsight Compute: the file takes about a minute per GPU used."""

from __future__ import annotations

import os
import subprocess

import pytest
from mcp import Client

from kforge.server.app import build_server
from kforge.server.settings import Settings, tool_context

from .conftest import EXAMPLES

pytestmark = [pytest.mark.anyio, pytest.mark.gpu]

_PROBLEM = EXAMPLES.parent / "problems" / "relu" / "reference.py"
_CANDIDATE = EXAMPLES / "cuda" / "candidate.py"


def _where_check(uuid: str) -> str:
    """Source that raises at import unless this process sees exactly one GPU, the one with `uuid` (a pinned worker
    sees its GPU alone; a one-GPU host has one anyway)."""
    bare = uuid.removeprefix("GPU-")
    return (f"import torch as _t\n"
            f"_seen = [str(_t.cuda.get_device_properties(i).uuid).removeprefix('GPU-') for i in range(_t.cuda.device_count())]\n"
            f"if _seen != [{bare!r}]:\n"
            f"    raise RuntimeError(f'this worker sees GPUs {{_seen}}, not only {bare}')\n")


def _smi_uuids() -> list[str]:
    """The GPUs this process may use, as nvidia-smi names them, in its order (narrowed by CUDA_VISIBLE_DEVICES)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True,
                         check=True).stdout
    uuids = [line.strip() for line in out.splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return uuids
    return [uuids[int(v)] if v.strip().isdigit() else v.strip() for v in visible.split(",") if v.strip()]


def _data(result) -> dict:
    assert not result.is_error, result.content[0].text
    return result.structured_content


def _server(tmp_path):
    settings = Settings(home=tmp_path / "home", warm_workers=1, precompiled_headers=False, job_wait_s=600)
    tools = tool_context(settings)
    return tools, build_server(settings, tools)


async def _listed_gpus(client) -> list[dict]:
    listed = _data(await client.call_tool("list_backends", {}))
    cuda = next(b for b in listed["backends"] if b["backend"] == "cuda")
    assert cuda["ok"], cuda["reason"]
    return cuda["gpus"]


async def _run_on(client, gpu: dict, asked: int | None) -> None:
    """verify and profile with gpu=`asked`, checked to run on `gpu` (both sides, by the uuid check) and say so."""
    args = {"backend": "cuda", "reference_code": _where_check(gpu["uuid"]) + _PROBLEM.read_text(),
            "candidate_code": _where_check(gpu["uuid"]) + _CANDIDATE.read_text(),
            **({"gpu": asked} if asked is not None else {})}
    verified = _data(await client.call_tool("verify_against_reference", {**args, "trials": 2, "use_store": False}))
    assert verified["correct"], verified.get("failure")
    profiled = _data(await client.call_tool("profile_kernel", {**args, "baselines": ["eager"], "budget_s": 0.2,
                                                              "hardware_counters": False}))
    assert profiled["ok"], profiled.get("failure")
    for result in (verified, profiled):
        named = result["spec"]["gpu"]
        assert (named["index"], named["uuid"]) == (gpu["index"], gpu["uuid"]), named


async def test_gpus_are_listed_and_gpu_0_or_the_least_loaded_runs_there(tmp_path):
    smi = _smi_uuids()
    tools, server = _server(tmp_path)
    async with Client(server) as client:
        gpus = await _listed_gpus(client)
        assert [g["index"] for g in gpus] == list(range(len(smi)))
        assert sorted(g["uuid"].lower() for g in gpus) == sorted(u.lower() for u in smi)
        assert gpus[0]["uuid"].lower() == smi[0].lower(), "GPU 0 is not nvidia-smi's first GPU"
        assert all(g["name"] and g["memory_bytes"] > 2**30 for g in gpus), gpus
        await _run_on(client, gpus[0], 0)
        await _run_on(client, gpus[0], None)  # nothing else runs: the least loaded is the lowest index
        refused = await client.call_tool("verify_against_reference", {
            "backend": "cuda", "problem": "relu", "candidate_code": _CANDIDATE.read_text(), "gpu": len(gpus)})
        assert refused.is_error, refused.content[0].text
        text = refused.content[0].text
        assert f"gpu={len(gpus)} is out of range" in text and f"0 ({gpus[0]['name']})" in text, text
        devices = (await client.read_resource("kforge://devices")).contents[0].text
        assert gpus[0]["uuid"] in devices
        assert tools.pool is not None and not tools.pool.problems, tools.pool.problems  # warm workers (pinned) started


async def test_gpu_1_runs_on_the_second_gpu(tmp_path):
    smi = _smi_uuids()
    if len(smi) < 2:
        pytest.skip(f"this host offers {len(smi)} GPU: gpu=1 needs a second one (run on a multi-GPU host)")
    tools, server = _server(tmp_path)
    async with Client(server) as client:
        gpus = await _listed_gpus(client)
        await _run_on(client, gpus[1], 1)
        assert tools.pool is not None and not tools.pool.problems, tools.pool.problems
