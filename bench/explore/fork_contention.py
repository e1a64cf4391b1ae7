"""How much does readying a warm worker slow a job's GPU work beside it? (issue 16: a profile's revalidation
took 0.4 s instead of 0.09 s while the pool readied two workers, and verify's calibration 0.25-0.42 s.)

A measuring process runs a fixed piece of GPU work in a loop (a 4096^2 float32 GEMM, and the judge's output
comparison of a 4096^2 output with float64 exact values), timing each piece on the host clock. Meanwhile, in
turn, two other processes forked from a preloaded parent do one of:
  idle       nothing (the baseline);
  context    start CUDA (a context, one tiny launch);
  device     `_warm_device` (context, torch.profiler's start-up, cuBLAS, the flush buffer, timers);
  libraries  `_warm_device` and `_warm_libraries` (the judge's comparison, cuBLAS per dtype, cuDNN).
Printed: per mode, the median and the max of the measured pieces while the others were readying, over the
idle median. Run on a GPU host with the checkout importable as `kforge`: python3 bench/explore/fork_contention.py
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import time

MODES = ["idle", "context", "device", "libraries"]


def _ready(mode: str, go, done) -> None:
    go.wait()
    if mode == "idle":
        time.sleep(1.5)
    else:
        import torch

        from kforge.backends import load_backend
        from kforge.tools.harness.worker import _warm_device, _warm_libraries

        backend = load_backend("cuda")
        backend.setup()
        torch.ones(1, device="cuda").sum().item()
        if mode in ("device", "libraries"):
            _warm_device(backend)
        if mode == "libraries":
            _warm_libraries(backend)
        torch.cuda.synchronize()
    done.set()


def _measure(conn) -> None:
    import torch

    from kforge.tools.harness.compare import compare_outputs

    a = torch.randn(4096, 4096, device="cuda")
    exact = a.double()
    got = a + 1e-6
    pieces = {"gemm": lambda: (a @ a).sum().item(),
              "compare": lambda: compare_outputs([a], [got], exact=[exact], device="cuda")}
    for p in pieces.values():
        for _ in range(3):
            p()
    torch.cuda.synchronize()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg == "stop":
            return
        until = time.perf_counter() + msg
        times = {k: [] for k in pieces}
        while time.perf_counter() < until:
            for k, p in pieces.items():
                t = time.perf_counter()
                p()
                torch.cuda.synchronize()
                times[k].append(time.perf_counter() - t)
        conn.send(times)


def main() -> None:
    from kforge.tools.harness.worker import _fork_server_env, _preload

    guard = _fork_server_env("cuda")
    os.environ.update(guard)  # as the zygote: asking whether CUDA exists must not start it
    _preload("cuda")
    for name in guard:
        os.environ.pop(name)
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe()
    meter = ctx.Process(target=_measure, args=(theirs,))
    meter.start()
    assert ours.recv() == "ready"
    rows = []
    for rep in range(2):
        for mode in MODES:
            go, dones = ctx.Event(), [ctx.Event(), ctx.Event()]
            procs = [ctx.Process(target=_ready, args=(mode, go, d)) for d in dones]
            for p in procs:
                p.start()
            time.sleep(0.3)  # forked, not yet started
            t0 = time.perf_counter()
            go.set()
            ours.send(0.05)  # a short window first, then until both are ready
            windows = [ours.recv()]
            while not all(d.is_set() for d in dones):
                ours.send(0.1)
                windows.append(ours.recv())
            ready_s = time.perf_counter() - t0
            for p in procs:
                p.join()
            merged = {k: [t for w in windows for t in w[k]] for k in windows[0]}
            rows.append({"mode": mode, "rep": rep, "ready_s": round(ready_s, 3),
                         **{f"{k}_median_ms": round(1e3 * statistics.median(v), 3) for k, v in merged.items()},
                         **{f"{k}_max_ms": round(1e3 * max(v), 3) for k, v in merged.items()},
                         **{f"{k}_n": len(v) for k, v in merged.items()}})
    ours.send("stop")
    meter.join()
    base = {k: statistics.median(r[k] for r in rows if r["mode"] == "idle")
            for k in ("gemm_median_ms", "compare_median_ms")}
    print("| mode | rep | readying s | gemm median ms (x idle) | gemm max ms | compare median ms (x idle) | compare max ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['rep']} | {r['ready_s']} | {r['gemm_median_ms']} ({r['gemm_median_ms'] / base['gemm_median_ms']:.2f}) "
              f"| {r['gemm_max_ms']} | {r['compare_median_ms']} ({r['compare_median_ms'] / base['compare_median_ms']:.2f}) "
              f"| {r['compare_max_ms']} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
