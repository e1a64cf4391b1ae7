"""Which step of readying a forked worker slows down when many ready at once, and does a second GPU help? (issue 21:
on 2x H200 the pool's forks took 4.4 s each with one GPU and 8.8 s with two, at the same ~2.2 forks per second for the
whole host, while the host's CPUs were 24-27% busy: something the host shares limits them.)

A parent preloads as the pool's zygote does (`worker._preload`), then forks N workers at once. Each child does what a
forked worker does before its first job, timing every step on the host clock:
  sandbox    `worker._isolation` (namespaces, mounts, Landlock, seccomp; only with --sandbox)
  backend    load_backend + setup
  context    the CUDA context and one launch
  cupti      torch.profiler's start-up (the first part of `_warm_device`)
  device     the rest of `_warm_device` (cuBLAS, the flush buffer, timers)
  libraries  `_warm_libraries` (the comparison's kernels, cuBLAS per dtype, cuDNN)
Configurations: N children on GPU 0 only, or spread over GPUs 0 and 1 (CUDA_VISIBLE_DEVICES per child, as the pool
pins). Prints per configuration the wall time until all were ready, forks per second, and each step's median and max.

  python3 bench/explore/fork_scaling.py [--sandbox] [--configs 1x1 8x1 8x2 16x1 16x2] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

STEPS = ["fork", "sandbox", "backend", "context", "cupti", "device", "libraries"]


def _child(wfd: int, gpu: str, conf_arg: str | None, forked_at: float) -> None:
    marks = {"fork": time.perf_counter() - forked_at}
    t = time.perf_counter()

    def mark(step: str) -> None:
        nonlocal t
        now = time.perf_counter()
        marks[step] = now - t
        t = now

    from kforge.tools.harness import worker as w

    os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    if conf_arg is not None:
        from kforge.tools.process.sandbox import Confinement

        w._isolation(Confinement.from_arg(conf_arg), "host", "cuda", gpu)
    mark("sandbox")
    import torch
    from torch.profiler import profile

    from kforge.backends import load_backend

    backend = load_backend("cuda")
    backend.setup()
    mark("backend")
    x = torch.ones(256, device="cuda")
    torch.cuda.synchronize()
    mark("context")
    with profile(activities=backend.profiler_activities()):
        (x + 1).sum()
        torch.cuda.synchronize()
    mark("cupti")
    w._warm_device(backend)  # (its profiler part again: warm now, ~ms)
    torch.cuda.synchronize()
    mark("device")
    w._warm_libraries(backend)
    torch.cuda.synchronize()
    mark("libraries")
    os.write(wfd, (json.dumps(marks) + "\n").encode())
    os.close(wfd)


def _run(n: int, gpus: int, conf_arg: str | None) -> dict:
    pipes, pids = [], []
    started = time.perf_counter()
    for i in range(n):
        r, wfd = os.pipe()
        forked_at = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                _child(wfd, str(i % gpus), conf_arg, forked_at)
                code = 0
            finally:
                os._exit(code)
        os.close(wfd)
        pipes.append(r)
        pids.append(pid)
    rows = []
    for r, pid in zip(pipes, pids):
        with os.fdopen(r) as f:
            line = f.read().strip()
        os.waitpid(pid, 0)
        if line:
            rows.append(json.loads(line))
    wall = time.perf_counter() - started
    out = {"n": n, "gpus": gpus, "ready": len(rows), "wall_s": round(wall, 3), "forks_per_s": round(len(rows) / wall, 2),
           "ready_s_p50": round(statistics.median(sum(r.values()) for r in rows), 3) if rows else None}
    for step in STEPS:
        vals = [r[step] for r in rows if step in r]
        if vals:
            out[step] = {"p50": round(statistics.median(vals), 3), "max": round(max(vals), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sandbox", action="store_true", help="children enter the workers' sandbox first")
    ap.add_argument("--configs", nargs="+", default=["1x1", "4x1", "8x1", "8x2", "16x1", "16x2"],
                    help="NxG: N children at once over G GPUs")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from kforge.tools.harness import worker as w

    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    t = time.perf_counter()
    w._preload("cuda")
    print(f"preload {time.perf_counter() - t:.1f} s", flush=True)
    conf_arg = None
    if args.sandbox:
        from kforge.tools.process.sandbox import Confinement

        home = Path(tempfile.mkdtemp(prefix="kffs-"))
        (home / "cache").mkdir()
        conf_arg = Confinement(home=str(home), extra_writable=(str(home / "jobs"),)).as_arg()
        (home / "jobs").mkdir()
    results = []
    for cfg in args.configs:
        n, g = (int(v) for v in cfg.split("x"))
        res = _run(n, g, conf_arg)
        results.append(res)
        steps = "  ".join(f"{s} {res[s]['p50']:.2f}/{res[s]['max']:.2f}" for s in STEPS if s in res)
        print(f"{cfg:>5} sandbox={'on' if conf_arg else 'off'}: ready {res['ready']}/{n} in {res['wall_s']:.2f} s "
              f"({res['forks_per_s']:.2f}/s, each p50 {res['ready_s_p50']} s); p50/max s: {steps}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"sandbox": bool(conf_arg), "python": sys.version.split()[0],
                                        "results": results}, indent=1))


if __name__ == "__main__":
    main()
