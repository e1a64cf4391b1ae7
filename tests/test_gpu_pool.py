"""The warm pool on a GPU host: a worker of the cpu backend holds no device context (it used to start CUDA
through torch's profiler and torch.cuda.is_available(): 1.15 GB of device memory each), while a cuda one does.
Skipped without a GPU; run by scripts/run_gpu_tests.sh."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest

from kforge.tools.context import ToolContext

from .test_pool import _tree

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


def _gpu_pids() -> set[int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True).stdout
    return {int(line) for line in out.split() if line.strip().isdigit()}


async def test_a_cpu_worker_holds_no_device_context_and_a_cuda_one_does(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        def idle(backend: str) -> list:  # on a host of several GPUs, each GPU's kind is pinned to it
            return [w for kind, ws in pool._idle.items() if kind[0] == backend for w in ws]

        with anyio.fail_after(240):
            while not (idle("cpu") and idle("cuda")):
                assert not pool.problems, pool.problems  # a kind whose forks failed: why, not a timeout
                await anyio.sleep(0.2)
        on_gpu = _gpu_pids()
        cpu_worker, cuda_worker = idle("cpu")[0], idle("cuda")[0]
        assert _tree(cuda_worker.proc.pid) & on_gpu, f"the cuda worker shows no context: {on_gpu}"
        assert cuda_worker.notes == []  # its judge's compare, the fused kernel (`harness/compare_kernel.py`), ran
        assert not _tree(cpu_worker.proc.pid) & on_gpu, "a cpu worker started a CUDA context"


async def test_forks_after_the_first_find_the_fused_compare_in_the_triton_seed(tmp_path):
    """The first GPU forks compile the fused compare while they ready and the pool seeds it (`triton_seed`); a fork
    after them copies the seed into its own Triton cache and compiles nothing: every entry its cache holds is the
    seed's (a key it missed would show as an entry of its own), and the seed did not grow."""
    from kforge.tools.process.triton_seed import seed_dir

    ctx = ToolContext(home=tmp_path / "home")
    seed = seed_dir(ctx.home)

    def idle_cuda() -> list:
        return [w for kind, ws in pool._idle.items() if kind[0] == "cuda" for w in ws]

    async with ctx.warm_workers(1) as pool:
        with anyio.fail_after(240):
            while not idle_cuda():
                assert not pool.problems, pool.problems
                await anyio.sleep(0.2)
        with anyio.fail_after(240):  # the forks started beside the first (before any seed) arrive
            while any(pool._starting.values()):
                await anyio.sleep(0.2)
        seeded = sorted(p.name for p in seed.iterdir()) if seed.is_dir() else []
        assert seeded, "the first cuda fork seeded nothing"
        before = {w.proc.pid for ws in pool._idle.values() for w in ws}
        kind = next(k for k, ws in pool._idle.items() if k[0] == "cuda" and ws)
        taken = pool.take(kind[0], dict(kind[1]))  # the pool refills it: a fork after the seed was made
        assert taken is not None

        def new_cuda() -> list:
            return [w for w in idle_cuda() if w.proc.pid not in before]

        with anyio.fail_after(240):
            while not new_cuda():
                assert not pool.problems, pool.problems
                await anyio.sleep(0.2)
        later = new_cuda()[0]
        own = sorted(p.name for p in (later.scratch / "triton").iterdir())
        assert later.notes == [] and set(own) <= set(seeded), (own, seeded)
        assert sorted(p.name for p in seed.iterdir()) == seeded
        await taken.discard()


async def test_a_kept_cuda_judge_gives_its_device_memory_back_and_judges_the_next_candidate_anew(tmp_path):
    """A judge kept for the next job of its reference (`WorkerPool.give_back_kept`) on a GPU: its reset leaves its
    allocator holding little, the next verify is served by the same process, and a wrong candidate after a right
    one still fails there."""
    from kforge.server.catalog import problem_reference
    from kforge.tools.evaluate import verify_against_reference
    from kforge.tools.requests import VerifyRequest

    right = (Path(__file__).parent / "candidates" / "relu_python.py").read_text()
    wrong = right.replace("torch.clamp_min(x, 0.0)", "torch.clamp_min(x, 0.0) + 1e-2")
    ctx = ToolContext(home=tmp_path / "home")
    # The first verify would also start the torch.compile warm-up, whose judge is kept under the same key
    # (tests/test_gpu_warmup.py): which of the two serves the next verify would then depend on timing.
    ctx.warm_baselines = "off"

    async def verify(code: str):
        return await verify_against_reference(ctx, VerifyRequest(backend="cuda", reference_code=problem_reference("relu"),
                                                                 candidate_code=code, use_store=False))

    async with ctx.warm_workers(1) as pool:
        first = await verify(right)
        assert first.correct, str(first)
        with anyio.fail_after(60):
            while not pool.kept["judge"]:
                await anyio.sleep(0.05)
        [judge] = [j for key, parked in pool._kept.items() if key[0] == "judge" for _, j in parked]
        pid = judge._proc.pid
        assert _tree(pid) & _gpu_pids(), "the kept judge holds no device context"
        second = await verify(wrong)
        assert not second.correct and pool.reused["judge"] == 1, str(second)
        with anyio.fail_after(60):
            while pool.kept["judge"] < 2:
                await anyio.sleep(0.05)
        assert [j._proc.pid for key, parked in pool._kept.items() if key[0] == "judge" for _, j in parked] == [pid]


async def test_a_kept_cuda_candidate_is_stopped_between_its_compile_verify_and_profile(tmp_path):
    """One candidate's compile, verify and profile on a GPU run in one process (`steps.keep_candidate`), which holds
    its device context and is stopped (state T) while kept."""
    from kforge.server.catalog import problem_reference
    from kforge.tools.evaluate import compile_kernel, verify_against_reference
    from kforge.tools.profile import profile_kernel
    from kforge.tools.requests import CompileRequest, ProfileRequest, VerifyRequest

    code = (Path(__file__).parent / "candidates" / "relu_python.py").read_text()
    reference = problem_reference("relu")
    ctx = ToolContext(home=tmp_path / "home")

    async def kept_pid(n: int) -> int:
        with anyio.fail_after(60):
            while pool.kept["candidate"] < n or pool._resetting:
                await anyio.sleep(0.05)
        [worker] = [w for key, parked in pool._kept.items() if key[0] == "candidate" for _, w in parked]
        return worker._proc.pid

    async with ctx.warm_workers(1) as pool:
        built = await compile_kernel(ctx, CompileRequest(backend="cuda", candidate_code=code, reference_code=reference,
                                                         use_store=False))
        assert built.ok, str(built)
        pid = await kept_pid(1)
        assert _tree(pid) & _gpu_pids(), "the kept candidate holds no device context"
        states = {Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] for p in _tree(pid)}
        assert states == {"T"}, f"a kept candidate's processes must all be stopped: {states}"
        verified = await verify_against_reference(ctx, VerifyRequest(backend="cuda", reference_code=reference,
                                                                     candidate_code=code, use_store=False))
        assert verified.correct and pool.reused["candidate"] == 1, str(verified)
        assert await kept_pid(2) == pid
        profiled = await profile_kernel(ctx, ProfileRequest(backend="cuda", reference_code=reference, candidate_code=code,
                                                            use_store=False, hardware_counters=False))
        assert profiled.ok and profiled.speedup_trusted and pool.reused["candidate"] == 2, str(profiled)
