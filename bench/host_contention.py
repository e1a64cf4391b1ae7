"""What other processes on the host do to the timing of a launch-bound kernel, and whether a core of its own
helps (issue 21: under concurrent clients every relu profile failed `wall_clock_anchor`, reading 12-20 us
per call against a 7-8 us timed median, in ops where the worker was hardly preempted).

The kernel: ReLU through an `nn.Module` on 1024x1024 fp32 (the pack's `relu` problem, ~7 us). Measured
in this process, as KForge's worker and server measure it:

- `wall/call`: the difference of the least wall time of N and of 2N back-to-back calls plus a sync,
  divided by N (the server's wall-clock anchor, `kforge.tools.profile._wall_anchor`);
- `event median`: CUDA events around one call after an L2 flush, median of many (the timing loop).

Under: an idle host; `busy`: one process per core, each a CPU matmul with torch's default threads (what
concurrent workers making inputs, importing and compiling look like); `spin`: one single-threaded spinner
per physical core (no oversubscription, but SMT siblings busy); each of the two again with this process
pinned to one physical core (all its SMT siblings) and the load pinned to the other cores; then, with no CPU load, `new CUDA contexts beside`: processes that keep starting,
creating a CUDA context and exiting (a pool readying warm workers), and `another context's kernels beside`.

    python3 bench/host_contention.py --out DIR [--tag TAG]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import time
from pathlib import Path


def _siblings(cpu: int) -> list[int]:
    text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def _physical_cores(cpus: list[int]) -> list[list[int]]:
    seen, cores = set(), []
    for c in cpus:
        if c not in seen:
            sib = [s for s in _siblings(c) if s in cpus]
            seen.update(sib)
            cores.append(sib)
    return cores


def _new_contexts(stop) -> None:
    """Processes that start, create a CUDA context (what a warm worker does when it readies its device), and go."""
    import subprocess
    import sys
    code = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"
    while not stop.is_set():
        subprocess.run([sys.executable, "-c", code], check=False)


def _busy(kind: str, cpus: list[int] | None, stop) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    if kind == "contexts":
        return _new_contexts(stop)
    if kind == "kernels":  # another context's small kernels, one at a time: time-slicing with ours
        import torch
        a = torch.randn(1024, 1024, device="cuda")
        while not stop.is_set():
            a.mul_(1.0)
            torch.cuda.synchronize()
        return
    if kind == "spin":
        os.environ["OMP_NUM_THREADS"] = "1"
        while not stop.is_set():
            sum(range(10000))
        return
    import torch
    a = torch.randn(512, 512)
    while not stop.is_set():
        a @ a


def _measure(reps: int) -> dict:
    import torch
    import torch.nn as nn

    class Relu(nn.Module):
        def forward(self, x):
            return torch.relu(x)

    model, dev = Relu(), torch.device("cuda")
    sets = [torch.randn(1024, 1024, device=dev) for _ in range(64)]  # 256 MB: beyond L2, as the timing sets
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=dev)
    with torch.no_grad():
        for x in sets:
            model(x)
        torch.cuda.synchronize()

        def op(n: int) -> float:
            t0 = time.perf_counter()
            for i in range(n):
                model(sets[i % len(sets)])
            torch.cuda.synchronize()
            return time.perf_counter() - t0

        n = 137  # the anchor's N for a 7.3 us median (1 ms of calls)
        short = [op(n) for _ in range(reps)]
        long = [op(2 * n) for _ in range(reps)]
        times = []
        for i in range(200):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            model(sets[i % len(sets)])
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
    times.sort()
    wall = (min(long) - min(short)) / n * 1e6
    med = statistics.median(times)
    return {"wall_per_call_us": round(wall, 2), "event_median_us": round(med, 2),
            "event_p90_us": round(times[int(0.9 * len(times))], 2), "event_max_us": round(times[-1], 2),
            "events_over_2x_median": sum(t > 2 * med for t in times), "wall_over_median": round(wall / med, 2),
            "ops": reps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--tag", default=time.strftime("%Y-%m-%d"))
    ap.add_argument("--reps", type=int, default=20, help="ops of N and of 2N calls per condition (the anchor: 3+)")
    args = ap.parse_args()
    import torch

    cpus = sorted(os.sched_getaffinity(0))
    cores = _physical_cores(cpus)
    mine = cores[-1]
    others = [c for core in cores[:-1] for c in core]
    ctx = mp.get_context("spawn")
    rows = []
    conditions = [("idle", None, None, False), ("busy", "busy", len(cpus), False),
                  ("spin", "spin", len(cores), False), ("busy, own core", "busy", len(cpus), True),
                  ("spin, own core", "spin", len(cores), True),
                  ("new CUDA contexts beside", "contexts", 2, False), ("another context's kernels beside", "kernels", 1, False)]
    for name, kind, count, pinned in conditions:
        os.sched_setaffinity(0, mine if pinned else cpus)
        stop = ctx.Event()
        procs = [ctx.Process(target=_busy, args=(kind, others if pinned else None, stop), daemon=True)
                 for _ in range(count or 0)]
        for p in procs:
            p.start()
        time.sleep(8 if kind in ("contexts", "kernels") else 3 if procs else 0)  # let the load start (imports)
        row = {"condition": name, "load_processes": len(procs), **_measure(args.reps)}
        stop.set()
        for p in procs:
            p.join(10)
        rows.append(row)
        print(row, flush=True)
    os.sched_setaffinity(0, cpus)
    run = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "host": platform.node(),
           "cpus": len(cpus), "physical_cores": len(cores), "threads_per_core": max(len(c) for c in cores),
           "own_core": mine, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cpu_model": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                              if ln.startswith("model name")), "?")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"host-contention-{args.tag}.json").write_text(json.dumps({"run": run, "rows": rows}, indent=1))
    lines = [f"# A launch-bound kernel's timing under host load\n\n{run['date']}, {run['gpu']}, {run['cpu_model']}, "
             f"{run['cpus']} CPUs = {run['physical_cores']} cores x {run['threads_per_core']} threads; torch "
             f"{run['torch']}; own core = CPUs {mine}\n",
             "| condition | load processes | wall/call us (anchor) | event median us | event p90 us | event max us | "
             "events > 2x median (of 200) | wall / median |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['condition']} | {r['load_processes']} | {r['wall_per_call_us']} | {r['event_median_us']} | "
              f"{r['event_p90_us']} | {r['event_max_us']} | {r['events_over_2x_median']} | {r['wall_over_median']} |"
              for r in rows]
    (args.out / f"host-contention-{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
