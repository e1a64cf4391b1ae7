"""Why do a profile's baseline rounds cost twice the candidate's? (issue 16, must-hold 4)

On level2/52 (Conv2d + activation + BatchNorm, 5.5 ms a call) on an H200, the judge's eager and torch.compile rounds
took 0.29-0.39 s against the candidate's 0.18 s for the same model: the baselines' samples had a slow tail (eager's
q3 1.8% over its median, the candidate's 0.15%), so their median's interval did not narrow to the policy's +-0.5%
and each round ran to its budget (111 and 132 samples against the candidate's 45).

This times the problem's model with KForge's own loop (`kforge.tools.harness.timing.time_model`, a profile's
per-round policy and a judge's two copied timing sets) in fresh processes:

- judge: eager x3 rounds, then torch.compile and eager interleaved x3 (what a profile's judge does after compiling);
- candidate: eager x6 rounds, nothing compiled in the process.

Per round: samples, wall seconds, median, q1, q3, max, and the share of samples over 1% above the median.

    python3 bench/explore/baseline_rounds.py --kernelbench .kb --problem level2/52 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from compile_cost import problem_path  # the sibling explore (this directory is the script's path)

_CHILD = r"""
import importlib.util, json, statistics, sys, time
import torch
from kforge.backends import load_backend
from kforge.tools.harness.bench import _COPIED_SET_BYTES
from kforge.tools.harness.inputs import seeded_inputs
from kforge.tools.harness.timing import ReplaySchedule, TimingPolicy, time_model
path, role, budget = sys.argv[1], sys.argv[2], float(sys.argv[3])
backend = load_backend("cuda"); backend.setup()
spec = importlib.util.spec_from_file_location("problem", path)
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
torch.manual_seed(0)
with torch.device("cuda"):
    model = mod.Model(*mod.get_init_inputs())
sets = [seeded_inputs(mod, seed, backend) for seed in (11, 12)]
copied = sum(a.numel() * a.element_size() for a in sets[0] if isinstance(a, torch.Tensor)) <= _COPIED_SET_BYTES
def make_args(i):
    raw = sets[i % len(sets)]
    return [a.clone() if copied and isinstance(a, torch.Tensor) else a for a in raw]
schedules = {}
compiled = None
def one_round(name):
    global compiled
    fn = model
    if name == "torch.compile":
        if compiled is None:
            compiled = torch.compile(model)
        fn = compiled
    sched = schedules.setdefault(name, ReplaySchedule(2))
    t = time.perf_counter()
    with torch.no_grad():
        timed = time_model(name, fn, make_args, backend, TimingPolicy(budget_s=budget), schedule=sched)
    s = sorted(timed.samples_s)
    med = statistics.median(s)
    q = statistics.quantiles(s, n=4)
    return {"role": role, "series": name, "wall_s": round(time.perf_counter() - t, 3), "samples": len(s),
            "median_us": round(med * 1e6, 1), "q1_us": round(q[0] * 1e6, 1), "q3_us": round(q[2] * 1e6, 1),
            "max_us": round(s[-1] * 1e6, 1), "over_1pct": round(sum(x > 1.01 * med for x in s) / len(s), 3),
            "warnings": list(timed.stats.warnings)}
rows = []
if role == "judge":
    for _ in range(3):
        rows.append(one_round("eager"))
    for r in range(3):
        for name in (["eager", "torch.compile"] if r % 2 == 0 else ["torch.compile", "eager"]):
            rows.append(one_round(name))
else:
    for _ in range(6):
        rows.append(one_round("eager"))
print(json.dumps(rows))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", type=Path, required=True)
    ap.add_argument("--problem", default="level2/52")
    ap.add_argument("--budget-s", type=float, default=1.0 / 3, help="a round's budget (a profile's 1 s over 3 rounds)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    path = problem_path(args.kernelbench, args.problem)
    rows = []
    for role in ("judge", "candidate"):
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), role, str(args.budget_s)], capture_output=True,
                              text=True, timeout=300)
        if proc.returncode != 0:
            rows.append({"role": role, "error": proc.stderr[-3000:]})
            print(rows[-1]["error"])
            continue
        rows += json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\n{args.problem}, round budget {args.budget_s:.3f} s")
    print("| process | series | wall s | samples | median us | q1 us | q3 us | max us | share > 1.01 median |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" not in r:
            print(f"| {r['role']} | {r['series']} | {r['wall_s']} | {r['samples']} | {r['median_us']} | {r['q1_us']} | "
                  f"{r['q3_us']} | {r['max_us']} | {r['over_1pct']} |")
    for role in ("judge", "candidate"):
        eager = [r["median_us"] for r in rows if r.get("role") == role and r.get("series") == "eager"]
        if eager:
            print(f"{role}: eager medians {min(eager)}-{max(eager)} us, median {statistics.median(eager)}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "baseline-rounds.json").write_text(json.dumps({"problem": args.problem, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
