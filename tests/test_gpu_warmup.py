"""The torch.compile baseline compiled ahead on a GPU (`kforge.tools.warmup`, `warm_baselines="gpu"`): beside a
new problem's first verify on cuda, a judge of its own compiles the reference with torch.compile; the profile that
follows at once times torch.compile in that judge. Skipped without a GPU; run by scripts/run_gpu_tests.sh."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from kforge.server.catalog import problem_reference
from kforge.tools.context import ToolContext
from kforge.tools.evaluate import verify_against_reference
from kforge.tools.process.limits import WorkerLimits
from kforge.tools.profile import profile_kernel
from kforge.tools.requests import ProfileRequest, VerifyRequest

from .test_baseline_warmup import _lines

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

RELU = (Path(__file__).parent / "candidates" / "relu_python.py").read_text()


async def test_a_cuda_profile_after_a_verify_times_torch_compile_in_the_judge_that_compiled_it_ahead(tmp_path):
    trace = tmp_path / "trace.jsonl"
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(trace_file=str(trace)))
    ctx.warm_baselines = "gpu"
    reference = problem_reference("relu")
    async with ctx.warm_workers(2) as pool:
        with anyio.fail_after(240):
            while sum(len(ws) for kind, ws in pool._idle.items() if kind[0] == "cuda") < 2:
                await anyio.sleep(0.2)
        verified = await verify_against_reference(ctx, VerifyRequest(backend="cuda", reference_code=reference,
                                                                     candidate_code=RELU, use_store=False))
        assert verified.correct, str(verified)
        prof = await profile_kernel(ctx, ProfileRequest(backend="cuda", reference_code=reference, candidate_code=RELU,
                                                        baselines=("eager", "torch.compile"), budget_s=0.5,
                                                        hardware_counters=False, use_store=False))
        assert prof.ok and prof.output_correct, prof.failure
        assert {b.name for b in prof.report.baselines if b.timing is not None} == {"eager", "torch.compile"}
    lines = _lines(trace)
    [warmup] = [line for line in lines if line["op"] == "warmup.torch_compile"]
    assert warmup["outcome"] == "kept", warmup
    times = [line for line in lines if line["role"] == "judge" and line["op"] == "time"]
    assert {line["pid"] for line in times[1:]} == {times[0]["pid"]}, times
