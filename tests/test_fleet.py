"""The fleet on Ray, end to end: a Ray cluster of a head and two one-CPU nodes in this machine
(`ray.cluster_utils.Cluster`) runs the jobs of a real `kforge serve --ray ADDRESS`, driven through the MCP SDK's
client: the cpu backend's compile, verify and profile; a cancel; a node removed mid-job.

The nodes' data directory is the session's (so the example's C++ build is cached from the other end-to-end
tests); each server gets a fresh one of its own: nothing of it travels, results come back into it.
Skipped where Ray is not installed (`pip install -e ".[test]"` installs it)."""

from __future__ import annotations

import json
import signal
import time
import uuid

import anyio
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from .conftest import HttpServer, stdio_session  # noqa: E402
from .test_e2e_remote import _alive, _source, _tagged_sleeper  # noqa: E402

pytestmark = pytest.mark.anyio


def data(result) -> dict:
    assert not result.is_error, result.content[0].text
    return result.structured_content


@pytest.fixture(scope="module")
def cluster():
    """A head that runs no jobs (0 CPUs) and two nodes of one CPU each: one job per node at a time.

    Started with SIGINT ignored, as a Ray node started from a background shell (`ray start ... &`, nohup) is: its
    workers inherit that, and Ray's cancel interrupts a task through SIGINT's handler."""
    was = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    finally:
        signal.signal(signal.SIGINT, was)
    yield cluster
    cluster.shutdown()


def fleet_env(cluster, node_home) -> dict[str, str]:
    return {"KFORGE_RAY": cluster.address, "KFORGE_RAY_NODE_HOME": str(node_home)}


@pytest.fixture(scope="module")
def fleet_server(cluster, kforge_home, tmp_path_factory):
    server = HttpServer(tmp_path_factory.mktemp("fleet-server-home"), **fleet_env(cluster, kforge_home))
    yield server
    server.stop()


async def _job(client, job_id: str) -> dict:
    rows = json.loads((await client.read_resource("kforge://jobs")).contents[0].text)
    return next(r for r in rows if r["job_id"] == job_id)


async def test_compile_verify_and_profile_run_on_the_fleets_nodes(cluster, kforge_home, tmp_path, cpu_example):
    ref, cand = cpu_example["reference"], cpu_example["candidate"]
    async with stdio_session(tmp_path, **fleet_env(cluster, kforge_home)) as client:  # stdout stays MCP's alone
        backends = data(await client.call_tool("list_backends", {}))["backends"]  # as the nodes offer them
        assert {b["backend"]: b["ok"] for b in backends}["cpu"]
        built = data(await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": cand,
                                                               "use_store": False}))
        assert built["ok"] and built["builds"][0]["name"] == "fused_relu_scale_bias"
        verdict = data(await client.call_tool("verify_against_reference", {
            "backend": "cpu", "reference_code": ref, "candidate_code": cand, "trials": 3, "use_store": False}))
        assert verdict["correct"] and len(verdict["trials"]) == 3
        prof = data(await client.call_tool("profile_kernel", {
            "backend": "cpu", "reference_code": ref, "candidate_code": cand, "baselines": ["eager"], "budget_s": 0.3}))
        assert prof["ok"] and prof["output_correct"] and prof["report"]["candidate"]["median_us"] > 0
        # The profile, its artifacts and the problem's history came back into the server's store.
        stored = json.loads((await client.read_resource(f"kforge://profiles/{prof['profile_id']}")).contents[0].text)
        assert stored["profile_id"] == prof["profile_id"]
        trace_uri = next(a for a in stored["artifacts"] if a.endswith("/trace.json"))
        assert "traceEvents" in (await client.read_resource(trace_uri)).contents[0].text
        summary = data(await client.call_tool("summarize_profile", {"profile_id": prof["profile_id"]}))
        assert summary["analysis"]["bottleneck"]
        history = json.loads((await client.read_resource(
            f"kforge://history/{verdict['spec']['reference_sha256']}")).contents[0].text)
        assert {e["tool"] for e in history["entries"]} == {"verify_against_reference", "profile_kernel"}
        rows = json.loads((await client.read_resource("kforge://jobs")).contents[0].text)
    assert len(rows) == 3 and all(r["message"].startswith("done on Ray node ") for r in rows), rows
    # The nodes built in their own data directory; the server's holds the store and nothing built.
    assert not list((tmp_path / "cache").glob("builds/*")) and list((kforge_home / "cache").glob("builds/*"))


async def test_cancel_job_cancels_the_ray_task_and_kills_its_workers(fleet_server):
    tag = str(time.time_ns())
    code = _source("spawns_and_spins", TAG=tag) + f"\n# {uuid.uuid4().hex}\n"
    async with fleet_server.session() as client:
        handle = data(await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": code, "wait_s": 0}))
        with anyio.fail_after(120):
            while (found := _tagged_sleeper(tag)) is None:
                await anyio.sleep(0.2)
        worker, child = found
        assert "(on Ray node " in (await _job(client, handle["job_id"]))["message"]
        answer = data(await client.call_tool("cancel_job", {"job_id": handle["job_id"]}))
        assert answer["status"] == "cancelled" and "worker processes were killed" in answer["message"]
        deadline = time.monotonic() + 20
        while (_alive(worker) or _alive(child)) and time.monotonic() < deadline:
            await anyio.sleep(0.1)
        assert not _alive(worker) and not _alive(child)


async def test_a_node_that_dies_mid_job_requeues_the_job_on_another(cluster, fleet_server, candidate):
    code = candidate("slow_import") + f"\n# {uuid.uuid4().hex}\n"  # unique: it really runs; 6 s at import
    async with fleet_server.session() as client:
        handle = data(await client.call_tool("verify_against_reference", {
            "backend": "cpu", "problem": "relu", "candidate_code": code, "trials": 2, "wait_s": 0}))
        job_id = handle["job_id"]
        with anyio.fail_after(120):
            while "on Ray node " not in (message := (await _job(client, job_id))["message"]):
                await anyio.sleep(0.2)
        node_id = message.split("on Ray node ")[1].split()[0]
        dying = next(n for n in cluster.worker_nodes if n.node_id.startswith(node_id))
        cluster.remove_node(dying)
        verdict = data(await client.call_tool("get_job", {"job_id": job_id, "wait_s": 300}))
        row = await _job(client, job_id)
    assert verdict["correct"], verdict
    assert row["status"] == "done" and row["message"].startswith("done on Ray node "), row
    assert f"re-queued once after Ray node {node_id}" in row["message"] and "died mid-job" in row["message"], row
    assert node_id not in row["message"].split(";")[0]  # it finished on the other node
