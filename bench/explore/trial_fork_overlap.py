"""Which of a throughput run's candidate trials were slow, and what ran beside them (issue 21: why each candidate's
host-bound work took a third longer on two GPUs than on one, s25).

Reads a server trace kept by `bench/gpu_throughput.py --keep-traces` and prints, per trial index within a candidate
worker (verify's five, then profile's), how many trials took over `--slow-s`, and, for slow and fast trials, whether a
pool fork (a new worker readying its CUDA context) ran on the trial's own GPU or on another one meanwhile.

    python3 bench/explore/trial_fork_overlap.py bench/results/gpu-throughput-h200x2-2026-11-28-s25-c16-2gpu-trace.jsonl.gz
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path


def _gpu(place: str) -> str:
    """The GPU a worker or a fork is pinned to ("" when unpinned: a one-GPU run)."""
    return place.split("=")[-1] if "=" in place else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--slow-s", type=float, default=0.2)
    args = ap.parse_args()
    for path in args.traces:
        with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
            lines = [json.loads(line) for line in f]
        forks = [(d["at"], d["at"] + d["s"], _gpu(d["op"])) for d in lines
                 if d["role"] == "pool" and d["op"].startswith("fork ")]
        by_worker: dict[int, list[dict]] = collections.defaultdict(list)
        for d in lines:
            if d["role"] == "candidate" and d["op"] == "trial" and "pid" in d:
                by_worker[d["pid"]].append(d)
        per_index: dict[int, list[float]] = collections.defaultdict(list)
        beside: collections.Counter[tuple[str, bool, bool]] = collections.Counter()
        for trials in by_worker.values():
            for i, d in enumerate(sorted(trials, key=lambda t: t["at"])):
                per_index[i].append(d["s"])
                start, end, gpu = d["at"], d["at"] + d["s"], _gpu(d.get("on", ""))
                same = any(s < end and e > start and g == gpu for s, e, g in forks)
                other = any(s < end and e > start and g != gpu for s, e, g in forks)
                beside["slow" if d["s"] > args.slow_s else "fast", same, other] += 1
        print(f"{path.name}: {sum(map(len, per_index.values()))} trials, {len(forks)} forks")
        print("  trial index | slow / all | median s | p90 s")
        for i in sorted(per_index):
            v = sorted(per_index[i])
            print(f"  {i} | {sum(s > args.slow_s for s in v)} / {len(v)} | {v[len(v) // 2]:.3f} | {v[int(len(v) * 0.9)]:.3f}")
        print("  trials by a fork beside them (on its GPU, on another GPU): count")
        for (speed, same, other), n in sorted(beside.items()):
            print(f"  {speed} | same GPU {'yes' if same else 'no'} | other GPU {'yes' if other else 'no'} | {n}")


if __name__ == "__main__":
    main()
