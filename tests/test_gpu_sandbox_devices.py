"""The NVIDIA device nodes a sandboxed worker may open, on a real GPU host (skipped without a GPU; run by
scripts/run_gpu_tests.sh): a worker of the cpu backend opens none (EACCES) and holds none, a cuda worker pinned to
one GPU opens that GPU's node and the control nodes, no other GPU's, and CUDA works in it. Workers are started as
the tools start them (`ToolContext.worker`), cold and forked from the pool's zygote. A pin is forced with a
placement "of two GPUs" so a one-GPU host tests it too (the server pins only where a host has several).
The same rules without a GPU, on fake device nodes: tests/test_sandbox_devices.py."""

from __future__ import annotations

import contextlib

import anyio
import pytest

from kforge.tools import gpus
from kforge.tools.context import ToolContext
from kforge.tools.process.protocol import LoadRequest
from kforge.tools.process.runner import WorkerGroup
from kforge.backends._nvidia import nvidia_gpus

from .test_sandbox_devices import PROBE, probe_report

pytestmark = [pytest.mark.anyio, pytest.mark.gpu]

_CUDA = """
import torch
x = torch.ones(4, device="cuda")
report["cuda"] = float((x * 2).sum().item())
report["uuid"] = str(torch.cuda.get_device_properties(0).uuid)
report["count"] = torch.cuda.device_count()
"""


async def _probe(ctx: ToolContext, backend: str, extra: str = "") -> tuple[dict, dict]:
    """The isolation report of a worker of `backend` (and whether it came warm) and what the probe candidate met."""
    with ctx.scratch("devices") as scratch:
        async with WorkerGroup() as group:
            worker = await group.start(ctx.worker(backend, scratch / "candidate", "candidate"))
            reply = await worker.call(LoadRequest(role="candidate", source=PROBE.replace("__EXTRA__", extra)),
                                      stage="load")
    missing = [m for m in worker.isolation["missing"] if "landlock" in m]
    if missing:
        pytest.skip(f"this host refuses Landlock: {missing}")
    return {**worker.isolation, "warm": worker.warm}, probe_report(reply.model_dump(mode="json"))


async def _forks_ready(pool, kinds: list[tuple[str, dict]]) -> None:
    """Ask the pool for a warm worker of each kind and wait until one is idle (a job waits only 30 s for a fork)."""
    for backend, env in kinds:
        pool.want(backend, env)
    with anyio.fail_after(600):
        while not all(pool._idle[(b, tuple(sorted(env.items())))] for b, env in kinds):
            await anyio.sleep(0.2)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "forked"])
async def test_a_cpu_worker_opens_no_nvidia_node_and_a_pinned_cuda_worker_only_its_own(tmp_path, warm):
    ctx = ToolContext(home=tmp_path / "home")
    avail = await ctx.require_backend("cuda")
    gpu = avail.gpus[-1]  # on a host of several, not GPU 0
    if not gpu.uuid:
        pytest.skip("this torch names no GPU uuid: workers are pinned by index, which this test does not cover")
    bare = gpu.uuid.removeprefix("GPU-").lower()
    minor = next(g["minor"] for g in nvidia_gpus() if g["uuid"].removeprefix("GPU-").lower() == bare)
    placement = gpus.Placement(gpu, max(2, len(avail.gpus)))  # "of two": pinned even on a one-GPU host
    async with contextlib.AsyncExitStack() as stack:
        if warm:
            pool = await stack.enter_async_context(ctx.warm_workers(1))
            await _forks_ready(pool, [("cpu", {}), ("cuda", gpus.pin_env(placement))])

        isolation, report = await _probe(ctx, "cpu")
        assert "no GPU device nodes" in isolation["applied"] and isolation["warm"] == warm, isolation
        assert {"nvidiactl", "nvidia0"} <= set(report["open"]), report  # a GPU host: they are there to try
        assert all(errno == "EACCES" for errno in report["open"].values()), report
        assert report["held"] == [], report  # none inherited from the zygote either

        with gpus.placed_on(placement):
            isolation, report = await _probe(ctx, "cuda", _CUDA)
        own = f"nvidia{minor}"
        assert f"device nodes: {own} + control" in isolation["applied"] and isolation["warm"] == warm, isolation
        assert report["cuda"] == 8.0 and report["count"] == 1, report
        assert report["uuid"].removeprefix("GPU-").lower() == bare, report
        for node, got in report["open"].items():
            if node in (own, "nvidiactl", "nvidia-uvm"):
                assert got == "opened", report
            elif node.removeprefix("nvidia").isdigit():  # another GPU's
                assert got == "EACCES", report
        assert not [h for h in report["held"] if h.removeprefix("/dev/nvidia").isdigit() and h != f"/dev/{own}"], report
