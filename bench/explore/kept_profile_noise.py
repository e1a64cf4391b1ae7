"""Why a kept cuda candidate's profile was untrusted on a 16-core H200 (issue 16/18, session 18: 4 of 4 failed).

tests/test_gpu_pool.py::test_a_kept_cuda_candidate_is_stopped_between_its_compile_verify_and_profile runs compile,
verify, then profile of a ReLU candidate on a warm pool; its profile came back `stable_timing` failed: the judge's
eager and torch.compile series were noisy while the candidate's stayed tight. A plain process on the same host
stays tight (judge_noise.py). This runs the test's flow in variants, each several times, with the server's trace on,
and prints each profile's series (median, IQR) and what ran beside the judge's rounds (the pool's forks, reaps):

  A  as the test: compile, verify, profile at once
  B  the same, then wait until the pool has no fork under way before the profile
  C  as A, baselines eager only (no torch.compile in the judge)

    python3 bench/explore/kept_profile_noise.py --out DIR [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import anyio


def _series(result) -> dict:
    r = result.report
    if r is None:
        return {"failure": str(result.failure)[:300]}
    out = {"candidate": str(r.candidate)}
    for b in r.baselines:
        out[b.name] = str(b.timing) if b.timing is not None else f"not timed: {b.error}"
    out["trusted"] = result.speedup_trusted
    out["failed_checks"] = [f"{c.name}: {c.evidence[:200]}" for c in result.checks if c.status == "fail"]
    return out


async def one(variant: str, home: Path, trace: Path, backend: str) -> dict:
    from kforge.server.catalog import problem_reference
    from kforge.tools.context import ToolContext
    from kforge.tools.evaluate import compile_kernel, verify_against_reference
    from kforge.tools.process.limits import WorkerLimits
    from kforge.tools.profile import profile_kernel
    from kforge.tools.requests import CompileRequest, ProfileRequest, VerifyRequest

    code = (Path(__file__).parents[2] / "tests" / "candidates" / "relu_python.py").read_text()
    reference = problem_reference("relu")
    ctx = ToolContext(home=home, limits=WorkerLimits(trace_file=str(trace)))
    marks = {}
    async with ctx.warm_workers(1) as pool:
        t0 = time.monotonic()
        built = await compile_kernel(ctx, CompileRequest(backend=backend, candidate_code=code, reference_code=reference,
                                                         use_store=False))
        verified = await verify_against_reference(ctx, VerifyRequest(backend=backend, reference_code=reference,
                                                                     candidate_code=code, use_store=False))
        marks["verified_s"] = round(time.monotonic() - t0, 2)
        marks["forks_under_way_at_profile"] = len(pool._under_way)
        if variant == "B":
            with anyio.move_on_after(30):
                while pool._under_way or any(pool._resetting.values()):
                    await anyio.sleep(0.1)
            marks["waited_s"] = round(time.monotonic() - t0 - marks["verified_s"], 2)
        baselines = ("eager",) if variant == "C" else ("eager", "torch.compile")
        marks["profile_start_s"] = round(time.monotonic() - t0, 2)
        profiled = await profile_kernel(ctx, ProfileRequest(backend=backend, reference_code=reference, candidate_code=code,
                                                            use_store=False, hardware_counters=False,
                                                            baselines=baselines))
        marks["profile_end_s"] = round(time.monotonic() - t0, 2)
    return {"variant": variant, "built": built.ok, "correct": verified.correct, **marks, **_series(profiled),
            "t0_wall": time.time() - (time.monotonic() - t0)}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["A", "B", "C"])
    ap.add_argument("--backend", default="cuda")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(args.repeat):
        for v in args.variants:
            home = Path(f"/tmp/kpn-{v}-{i}")
            trace = args.out / f"trace-{v}-{i}.jsonl"
            row = await one(v, home, trace, args.backend)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "kept-profile-noise.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    anyio.run(main)
