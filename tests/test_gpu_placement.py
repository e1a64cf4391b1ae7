"""Placing jobs on the GPUs of a host, on a machine without a GPU: these test the queueing, the locks, the choice
of GPU, the workers' pin and the MCP surface, not a GPU. The hardware list is a fake one, put where the server
reads the probe worker's enumeration (`ToolContext.availability`); everything after it is the real code. The
same on a real GPU host: tests/test_gpu_devices.py."""

from __future__ import annotations

import json
import time

import anyio
import pytest
from mcp import Client
from pydantic import BaseModel

from kforge.backends import Availability, GpuInfo, backend_class
from kforge.server.app import build_server
from kforge.server.settings import Settings
from kforge.tools import gpus
from kforge.tools.context import ToolContext, warm_kinds
from kforge.tools.tool_inputs import RequestError
from kforge.tools.jobs import JobManager
from kforge.tools.models import CompileResult, JobSpec

pytestmark = pytest.mark.anyio

CPU = Availability(backend="cpu", ok=True, reason="test", device_name="test-cpu")

SYNC_LAUNCHES = backend_class("cuda").sync_launch_env  # a worker kind of synchronous launches


def fake_gpus(n: int) -> list[GpuInfo]:
    return [GpuInfo(index=i, name="Fake GPU", uuid=f"GPU-0000000{i}-fake", memory_bytes=80 * 2**30,
                    pin={"CUDA_VISIBLE_DEVICES": f"GPU-0000000{i}-fake"}) for i in range(n)]


def fake_cuda(n: int) -> Availability:
    return Availability(backend="cuda", ok=True, reason="test", device_name="Fake GPU", gpus=fake_gpus(n), kind="gpu",
                        sync_launch_env=SYNC_LAUNCHES)


def context_with(tmp_path, n_gpus: int) -> ToolContext:
    """A real ToolContext whose probe answered with `n_gpus` fake GPUs for `cuda` (and the cpu backend)."""
    ctx = ToolContext(home=tmp_path / "home")
    ctx._availability = [CPU, fake_cuda(n_gpus)]
    return ctx


class TimedRequest(BaseModel):
    """A request that times on its GPU as profile_kernel does (`ctx.device_use(ctx.device_key(...)).timing()`)
    and records when it held it; no worker, no device."""

    tool: str = "profile_kernel"
    backend: str = "cuda"
    candidate_code: str
    gpu: int | None = None
    seconds: float = 0.3

    async def run(self, ctx: ToolContext, progress) -> CompileResult:
        async with ctx.on_gpu(self.backend, self.gpu) as placement:
            avail = await ctx.require_backend(self.backend)
            async with ctx.device_use(ctx.device_key(avail)).timing():
                start = time.monotonic()
                await anyio.sleep(self.seconds)
                HELD.append((placement.gpu.index, start, time.monotonic()))
        spec = JobSpec(tool=self.tool, backend=self.backend, candidate_sha256=self.candidate_code, gpu=placement.gpu)
        return CompileResult(spec=spec, ok=True, build_seconds=0.0, load_seconds=0.0, from_cache=False)


HELD: list[tuple[int, float, float]] = []


async def _no_progress(done, total, message):
    return None


def test_the_least_loaded_gpu_is_chosen_ties_to_the_lowest_index():
    avail = fake_cuda(3)
    load = {0: 2, 1: 1, 2: 1}
    assert gpus.choose_gpu(avail, None, lambda p: load[p.gpu.index]).gpu.index == 1
    assert gpus.choose_gpu(avail, None, lambda p: 0).gpu.index == 0
    assert gpus.choose_gpu(avail, 2, lambda p: 99).gpu.index == 2  # an explicit index, however loaded
    # A GPU that keeps a process of the job's code (its compile's candidate) counts one call less loaded.
    kept_on_2 = lambda p: p.gpu.index == 2  # noqa: E731
    assert gpus.choose_gpu(avail, None, lambda p: load[p.gpu.index], kept_on_2).gpu.index == 2
    assert gpus.choose_gpu(avail, None, lambda p: 0, kept_on_2).gpu.index == 2
    assert gpus.choose_gpu(avail, None, lambda p: {0: 0, 1: 0, 2: 2}[p.gpu.index], kept_on_2).gpu.index == 0
    assert gpus.choose_gpu(avail, 1, lambda p: 0, kept_on_2).gpu.index == 1  # an explicit index wins


def test_an_index_out_of_range_names_the_gpus_there_are():
    with pytest.raises(RequestError) as err:
        gpus.choose_gpu(fake_cuda(2), 2, lambda p: 0)
    assert "gpu=2 is out of range" in str(err.value) and "0 (Fake GPU), 1 (Fake GPU)" in str(err.value)
    with pytest.raises(RequestError, match="runs on no GPU"):
        gpus.choose_gpu(CPU, 0, lambda p: 0)
    assert gpus.choose_gpu(CPU, None, lambda p: 0) is None  # cpu work is not placed


def test_workers_are_pinned_to_their_gpu_only_where_there_are_several(tmp_path):
    two, one = fake_cuda(2), fake_cuda(1)
    on_second = gpus.Placement(two.gpus[1], 2)
    assert gpus.pin_env(on_second) == {"CUDA_VISIBLE_DEVICES": "GPU-00000001-fake"}
    assert gpus.device_key(two, on_second) == "GPU 1 (Fake GPU)"
    alone = gpus.Placement(one.gpus[0], 1)  # one GPU: no pin, and the device keeps its old name
    assert gpus.pin_env(alone) == {} and gpus.device_key(one, alone) == "Fake GPU"
    assert gpus.device_key(CPU, None) == "test-cpu"
    # the warm pool keeps one kind per GPU, pinned; synchronous launches get none (only a faulting verify uses them)
    assert warm_kinds(two) == [{"CUDA_VISIBLE_DEVICES": "GPU-00000000-fake"},
                               {"CUDA_VISIBLE_DEVICES": "GPU-00000001-fake"}]
    assert warm_kinds(one) == [{}] and SYNC_LAUNCHES not in warm_kinds(one)
    assert warm_kinds(CPU) == [{}]  # calls on a CPU are synchronous already: one kind (`Availability.sync_launch_env`)


def test_a_worker_takes_the_pin_its_backend_gave_the_gpu(monkeypatch):
    """The pin is the backend's (`GpuInfo.pin`, from its probe): the tools copy it, whatever its variables. NVIDIA's
    names a GPU by uuid, and without one (a torch that gives none) by the index within the server's own
    CUDA_VISIBLE_DEVICES, which a worker's setting replaces."""
    from kforge.backends._nvidia import _visible_entry

    other = gpus.Placement(GpuInfo(index=1, name="Other", pin={"OTHER_VISIBLE_DEVICES": "7"}), 2)
    assert gpus.pin_env(other) == {"OTHER_VISIBLE_DEVICES": "7"}
    assert gpus.pin_env(gpus.Placement(other.gpu, 1)) == {}  # one GPU needs no pin
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _visible_entry(1) == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # the server sees physical GPUs 4 and 6 as 0 and 1
    assert _visible_entry(1) == "6"


async def test_a_tool_call_pins_its_workers_and_takes_the_least_busy_gpu(tmp_path):
    ctx = context_with(tmp_path, 2)
    async with ctx.on_gpu("cuda", None) as first:
        assert first.gpu.index == 0
        w = ctx.worker("cuda", tmp_path / "w", "candidate", extra_env=SYNC_LAUNCHES)
        assert w._extra_env == {"CUDA_VISIBLE_DEVICES": "GPU-00000000-fake", **SYNC_LAUNCHES}
        async with ctx.on_gpu("cuda", None) as second:  # GPU 0 is busy with the first call
            assert second.gpu.index == 1
            assert ctx.device_key(await ctx.require_backend("cuda")) == "GPU 1 (Fake GPU)"
            assert (await ctx.environment("cuda"))["device"] == "Fake GPU"
    assert gpus.current() is None  # the placement ends with the call
    async with ctx.on_gpu("cpu", None) as none:  # cpu work: no GPU, no pin (its setup hides the GPUs itself)
        assert none is None and ctx.worker("cpu", tmp_path / "c", "candidate")._extra_env is None


async def test_jobs_are_bound_to_the_least_loaded_gpu_and_queue_there(tmp_path):
    ctx = context_with(tmp_path, 2)
    manager = JobManager(ctx, parallel=4)
    HELD.clear()
    async with manager.running():
        jobs = [await manager.submit(TimedRequest(candidate_code=f"c{i}"), "a") for i in range(4)]
        assert [j.request.gpu for j in jobs] == [0, 1, 0, 1]
        assert [j.device for j in jobs] == ["GPU 0 (Fake GPU)", "GPU 1 (Fake GPU)"] * 2
        pinned = await manager.submit(TimedRequest(candidate_code="on 1", gpu=1), "b")
        assert pinned.request.gpu == 1 and pinned.device == "GPU 1 (Fake GPU)"
        with pytest.raises(RequestError, match="gpu=2 is out of range"):
            await manager.submit(TimedRequest(candidate_code="nowhere", gpu=2), "b")
        results = [await manager.wait(j, 10, _no_progress) for j in [*jobs, pinned]]
    assert [r.spec.gpu.index for r in results] == [0, 1, 0, 1, 1]
    for gpu in (0, 1):  # one timing at a time on each GPU
        spans = sorted((s, e) for g, s, e in HELD if g == gpu)
        assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), spans
    first = {g: min((s, e) for gg, s, e in HELD if gg == g) for g in (0, 1)}
    assert first[0][0] < first[1][1] and first[1][0] < first[0][1]  # ... and the two GPUs time at the same time


class KeptOn:
    """A pool that keeps a candidate process of one code on one GPU (what `WorkerPool.kept_pins` answers)."""

    def __init__(self, code: str, pin: str) -> None:
        self.code, self.pin = code, pin

    def kept_pins(self, role: str, backend: str, sha256: str) -> set[str]:
        from kforge.tools.models import sha256_text
        return {self.pin} if (role, backend, sha256) == ("candidate", "cuda", sha256_text(self.code)) else set()


async def test_a_job_goes_to_the_gpu_that_keeps_its_candidate(tmp_path):
    """The job manager places a candidate's next step where its process is kept (no fork, no second context), as
    direct calls do, unless that GPU is busier by more than one job."""
    ctx = context_with(tmp_path, 2)
    ctx.pool = KeptOn("kept code", "CUDA_VISIBLE_DEVICES=GPU-00000001-fake")
    manager = JobManager(ctx, parallel=4)
    HELD.clear()
    async with manager.running():
        kept = await manager.submit(TimedRequest(candidate_code="kept code"), "a")
        other = await manager.submit(TimedRequest(candidate_code="new code"), "a")
        assert (kept.request.gpu, other.request.gpu) == (1, 0)  # without the kept process: 0, then 1
        busier = [await manager.submit(TimedRequest(candidate_code=f"c{i}", gpu=1), "a") for i in range(2)]
        moved = await manager.submit(TimedRequest(candidate_code="kept code", seconds=0.2), "a")
        assert moved.request.gpu == 0  # GPU 1 has two jobs more: waiting there costs more than a new process
        for j in [kept, other, *busier, moved]:
            await manager.wait(j, 10, _no_progress)


async def test_one_gpu_keeps_one_queue_named_as_before(tmp_path):
    ctx = context_with(tmp_path, 1)
    manager = JobManager(ctx, parallel=2)
    HELD.clear()
    async with manager.running():
        jobs = [await manager.submit(TimedRequest(candidate_code=f"c{i}", seconds=0.1), "a") for i in range(2)]
        assert [j.device for j in jobs] == ["Fake GPU", "Fake GPU"] and [j.request.gpu for j in jobs] == [0, 0]
        for j in jobs:
            await manager.wait(j, 10, _no_progress)
    (s1, e1), (s2, e2) = sorted((s, e) for _, s, e in HELD)
    assert s2 >= e1


async def test_the_mcp_tools_take_gpu_and_list_each_gpu(tmp_path):
    ctx = context_with(tmp_path, 2)
    (ctx.home / "cache" / "ceilings").mkdir(parents=True)
    name = gpus.ceilings_name("cuda", "Fake GPU", "", "GPU-00000001-fake")  # measured on GPU 1 only
    (ctx.home / "cache" / "ceilings" / name).write_text('{"peak_bandwidth_gbs": 3000.0, "peak_tflops": {"bf16": 700.0}}')
    server = build_server(Settings(home=ctx.home, warm_workers=0, precompiled_headers=False), tools=ctx)
    async with Client(server) as client:
        schemas = {t.name: t.input_schema for t in (await client.list_tools()).tools}
        for tool in ("compile_kernel", "verify_against_reference", "profile_kernel"):
            assert "gpu" in schemas[tool]["properties"], tool
        listed = await client.call_tool("list_backends", {})
        text = listed.content[0].text
        assert "GPU 0: Fake GPU (GPU-00000000-fake, 80 GiB)" in text
        assert "GPU 1: Fake GPU (GPU-00000001-fake, 80 GiB); measured ceilings: copy 3000 GB/s; matmul bf16 700" in text
        cuda = next(b for b in listed.structured_content["backends"] if b["backend"] == "cuda")
        assert [g["uuid"] for g in cuda["gpus"]] == ["GPU-00000000-fake", "GPU-00000001-fake"]
        refused = await client.call_tool("verify_against_reference", {
            "backend": "cuda", "candidate_code": "x", "problem": "relu", "gpu": 2})
        assert refused.is_error and "gpu=2 is out of range" in refused.content[0].text
        assert "0 (Fake GPU), 1 (Fake GPU)" in refused.content[0].text
        on_cpu = await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": "x", "gpu": 0})
        assert on_cpu.is_error and "runs on no GPU" in on_cpu.content[0].text
        devices = (await client.read_resource("kforge://devices")).contents[0].text
    cuda = next(b for b in json.loads(devices)["backends"] if b["backend"] == "cuda")
    assert [g["index"] for g in cuda["gpus"]] == [0, 1] and cuda["gpus"][1]["peak_bandwidth_gbs"] == 3000.0


def test_the_texts_name_the_gpu_a_job_ran_on():
    from kforge.tools.models import TrialReport, VerifyResult

    def verdict(gpu: GpuInfo | None) -> str:
        spec = JobSpec(tool="verify", backend="cuda", candidate_sha256="c" * 64, gpu=gpu)
        return str(VerifyResult(spec=spec, ok=True, correct=True, trials=[TrialReport(trial=0, seed=1, correct=True,
                                                                                   outputs=[])]))

    head = verdict(GpuInfo(index=1, name="NVIDIA H200", uuid="GPU-1")).splitlines()[0]
    assert head.startswith("CORRECT: 1/1 trials passed on GPU 1 (NVIDIA H200) ("), head
    assert "on GPU" not in verdict(None)  # a CPU backend's text names no GPU


async def test_each_gpu_has_its_own_parallel_slots_and_the_host_caps_them_all(tmp_path):
    """`parallel` counts per device: with one slot each, a job on GPU 1 starts while GPU 0 runs one (a global
    count of slots held a 2-GPU H200 host to 1.23x one GPU's throughput, 2026-11-27), a second job on GPU 0
    waits for the first, and `host_parallel` bounds the jobs on the whole host."""

    class Slow(TimedRequest):
        tool: str = "compile_kernel"  # holds no device lock: only the job slots keep two jobs apart

        async def run(self, ctx: ToolContext, progress) -> CompileResult:
            start = time.monotonic()
            await anyio.sleep(self.seconds)
            RAN.append((self.gpu, start, time.monotonic()))
            spec = JobSpec(tool="compile", backend="cuda", candidate_sha256=self.candidate_code)
            return CompileResult(spec=spec, ok=True, build_seconds=0.0, load_seconds=0.0, from_cache=False)

    RAN: list[tuple[int | None, float, float]] = []
    for host_parallel, overlap in ((4, True), (1, False)):
        RAN.clear()
        manager = JobManager(context_with(tmp_path / str(host_parallel), 2), parallel=1, host_parallel=host_parallel)
        async with manager.running():
            jobs = [await manager.submit(Slow(candidate_code=f"c{i}", gpu=g), "a") for i, g in enumerate((0, 0, 1))]
            for j in jobs:
                await manager.wait(j, 10, _no_progress)
        spans = {g: sorted((s, e) for gg, s, e in RAN if gg == g) for g in (0, 1)}
        (a, b), (c, d) = spans[0]
        assert c >= b - 0.01  # one slot on GPU 0: its second job waited for its first
        (s1, e1) = spans[1][0]
        assert (s1 < b and a < e1) is overlap, (host_parallel, spans)  # GPU 1's job beside GPU 0's first, or not
