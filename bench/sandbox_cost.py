"""What the workers' sandbox (tools/process/sandbox.py) costs: entering it, a warm worker's start, and a whole verify.

Each series is measured with the sandbox on and off in the same run, alternating, so the ratio is what the
sandbox adds on this machine (issue 17: "measure what it adds to a warm worker's start, and keep the warm
pool's speed"). Prints a table and writes sandbox-cost-<tag>.json beside it.

    python bench/sandbox_cost.py --rounds 5 --out bench/results --tag ci-vm
    python bench/sandbox_cost.py --backend cuda --rounds 5 --tag h100   # a GPU worker: its device inside
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

_ENTER = """
import json, os, sys, time
from kforge.tools.process.sandbox import Confinement, enter
t0 = time.perf_counter()
if sys.argv[1] == "on":
    enter(Confinement(home=sys.argv[2]))
print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}))
"""


def enter_ms(home: str, mode: str) -> float:
    """Entering the sandbox in a fresh single-threaded process (what each forked worker pays, fork included)."""
    done = subprocess.run([sys.executable, "-c", _ENTER, mode, home], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["ms"]


async def verify_and_starts(home: Path, sandbox: bool, trace: Path, backend: str) -> dict[str, float]:
    """One warm pool's life: fork-to-warm times (a GPU worker's include its device context and warm-up), then a
    verify of the relu problem (warm workers)."""
    from kforge.server.catalog import problem_reference
    from kforge.tools.context import ToolContext
    from kforge.tools.evaluate import verify_against_reference
    from kforge.tools.requests import VerifyRequest
    from kforge.tools.process.limits import WorkerLimits

    here = Path(__file__).resolve().parents[1]
    candidate = (here / "tests" / "candidates" / "relu_python.py").read_text()
    ctx = ToolContext(home=home, limits=WorkerLimits(sandbox=sandbox, trace_file=str(trace)))
    async with ctx.warm_workers(1) as pool:
        await ctx.availability()
        deadline = time.monotonic() + 300
        while not pool.settled() and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        t0 = time.perf_counter()
        result = await verify_against_reference(ctx, VerifyRequest(backend=backend,
                                                                   reference_code=problem_reference("relu"),
                                                                   candidate_code=candidate + f"\n# {time.time_ns()}\n"))
        verify_s = time.perf_counter() - t0
        assert result.correct, result
    lines = [json.loads(x) for x in trace.read_text().splitlines()] if trace.exists() else []
    forks = [x["s"] for x in lines if x["role"] == "pool" and x["op"].startswith(f"fork {backend}")]
    starts = [x["s"] for x in lines if x["op"] == "start" and x["warm"]]
    trace.unlink(missing_ok=True)
    return {"fork_to_warm_s": statistics.median(forks) if forks else float("nan"),
            "warm_start_s": statistics.median(starts) if starts else float("nan"), "verify_s": verify_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tag", default=platform.node())
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--backend", default="cpu", help="the workers' backend: cpu, cuda or triton")
    args = parser.parse_args()
    trace = Path(tempfile.mkdtemp()) / "trace.jsonl"
    rows: dict[str, dict[str, list[float]]] = {"on": {}, "off": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                home = Path(tmp) / f"{mode}-{r}"
                rows[mode].setdefault("enter_ms", []).append(enter_ms(str(home), mode))
                for k, v in anyio.run(verify_and_starts, home, mode == "on", trace, args.backend).items():
                    rows[mode].setdefault(k, []).append(v)
    med = {m: {k: statistics.median(v) for k, v in series.items()} for m, series in rows.items()}
    print(f"{'series':16s} {'sandbox off':>12s} {'sandbox on':>12s} {'on/off':>8s}")
    for key in ("enter_ms", "fork_to_warm_s", "warm_start_s", "verify_s"):
        off, on = med["off"][key], med["on"][key]
        print(f"{key:16s} {off:12.4f} {on:12.4f} {on / off if off else float('nan'):8.2f}")
    import torch

    record = {"date": time.strftime("%Y-%m-%d"), "host": platform.node(), "cpus": os.cpu_count(),
              "kernel": platform.release(), "python": platform.python_version(), "torch": torch.__version__,
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "rounds": args.rounds, "backend": args.backend, "medians": med, "samples": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sandbox-cost-{args.tag}.json"
    path.write_text(json.dumps(record, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
