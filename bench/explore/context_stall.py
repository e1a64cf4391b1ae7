"""Does starting CUDA contexts in other processes slow a running process's device work? (issue 21)

In the seventeenth session's 2-GPU throughput run, trials ran ~10x slower than on one GPU (candidate.trial p50 0.161 s
against 0.014 s) while forks started device contexts for both GPUs and the host's CPUs were a quarter busy. A probe
process loops over what a trial does on GPU 0 (a small kernel and a synchronize; with `--uncached`, also a cudaMalloc
and cudaFree per iteration, as memory that crosses processes is) and times each iteration, while waves of fresh
processes start a context: first none (quiet), then on the other GPU, then on the probe's own GPU.

    python3 bench/explore/context_stall.py --out DIR [--starters 8] [--phase-s 8]

Prints a table (iteration p50 / p90 / max per phase) and writes context-stall.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

_PROBE = r"""
import json, sys, time, torch
uncached, seconds = sys.argv[1] == "1", float(sys.argv[2])
x = torch.randn(1 << 20, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
marks, t_end = [], time.perf_counter() + seconds
while time.perf_counter() < t_end:
    t = time.perf_counter()
    if uncached:
        y = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # a fresh cudaMalloc each time (no caching)
        y.fill_(1)
    torch.relu(x)
    torch.cuda.synchronize()
    if uncached:
        del y
    marks.append((t, time.perf_counter() - t))
print(json.dumps(marks), flush=True)
"""

_STARTER = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"


def _gpus() -> list[str]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True,
                         check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def _waves(gpu: str, starters: int, until: float) -> int:
    """Start `starters` context-starting processes at once on `gpu`, again as each wave ends, until `until`."""
    started = 0
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    while time.perf_counter() < until:
        procs = [subprocess.Popen([sys.executable, "-c", _STARTER], env=env) for _ in range(starters)]
        for p in procs:
            p.wait()
        started += starters
    return started


def _phase(name: str, probe_gpu: str, starter_gpu: str | None, args: argparse.Namespace, uncached: bool) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": probe_gpu}
    if uncached:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    probe = subprocess.Popen([sys.executable, "-c", _PROBE, "1" if uncached else "0", str(args.phase_s)], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert probe.stdout is not None and probe.stdin is not None
    assert probe.stdout.readline().strip() == "ready"
    probe.stdin.write("go\n")
    probe.stdin.flush()
    started = _waves(starter_gpu, args.starters, time.perf_counter() + args.phase_s) if starter_gpu else 0
    marks = json.loads(probe.stdout.readline())
    probe.wait()
    took = [s for _, s in marks]
    q = statistics.quantiles(took, n=10)
    row = {"phase": name, "uncached": uncached, "iterations": len(took), "contexts_started": started,
           "p50_ms": round(statistics.median(took) * 1e3, 3), "p90_ms": round(q[-1] * 1e3, 3),
           "max_ms": round(max(took) * 1e3, 3)}
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--starters", type=int, default=8, help="processes starting a context at once, per wave")
    ap.add_argument("--phase-s", type=float, default=8.0)
    args = ap.parse_args()
    gpus = _gpus()
    other = gpus[1] if len(gpus) > 1 else None
    rows = []
    for uncached in (False, True):
        rows.append(_phase("quiet", gpus[0], None, args, uncached))
        if other:
            rows.append(_phase("contexts starting on the other GPU", gpus[0], other, args, uncached))
        rows.append(_phase("contexts starting on the probe's GPU", gpus[0], gpus[0], args, uncached))
    print("\n| phase | malloc per iteration | iterations | contexts started | p50 ms | p90 ms | max ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['phase']} | {'yes' if r['uncached'] else 'no'} | {r['iterations']} | {r['contexts_started']} | "
              f"{r['p50_ms']} | {r['p90_ms']} | {r['max_ms']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "context-stall.json").write_text(json.dumps({"gpus": gpus, "starters": args.starters,
                                                             "phase_s": args.phase_s, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
