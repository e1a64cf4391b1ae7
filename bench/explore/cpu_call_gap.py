"""Why did KForge's CPU timing of short kernels read 10-25% higher than torch.utils.benchmark? (issue 16, must-hold 5)

The same built library (a repository test candidate's C++), called through its ModelNew as KForge calls it, is
timed by loops that differ from `plain` in one factor each, under one or more cache flushes:

  plain          flush; t0; out = m(x); t1; del out            (one input, read once between flushes)
  pre            two untimed calls m(x), then as plain          (the input re-used just before the flush)
  ub             torch.utils.benchmark Timer(stmt, setup="flush()").timeit(1)   (bench/cpu_timing_check's cold
                 column; timeit(1) runs two untimed calls, each after the setup's flush, before the timed one)
  clone          a = x.clone(); flush; t0; m(a); t1              (a) the worker's fresh input copy per call
  keep           plain, the output held until the next call's input is made (a) the worker's reservoir
  sets           x taken from 4 distinct input sets               (c) KForge's timing sets
  cputimer       plain with CpuBackend.timer (getrusage beside the window) (d)
  nograd         torch.no_grad() entered inside each timed call (the check's outside ModelNew until 2026-11-24;
                 the worker enters it once around its loop): more Python, run from flushed caches
  kforge         kforge.tools.harness.timing.time_model with the candidate worker's make_args (copies) and reservoir
  kforge-nocopy  the same, the sets not copied

Flushes: old (one pass writing 64 MiB: KForge's flush until 2026-11-24), kforge (CpuBackend.flush_cache as it is
now), single256 (one pass writing 256 MiB), add64 (one read+write pass over 64 MiB), twice64c16 (64 MiB in
16 MiB chunks, each written twice).

Loops run in blocks of --calls calls, in a new random order each repetition (interleaved: the host's drift
touches all alike). A loop's value in a repetition is its block median; each is compared with `plain` under
the same flush repetition by repetition: the median of those paired ratios and its ~95% interval (order
statistics). Calls during which another process took a CPU from this one are left out of the block medians,
and a repetition where that happened to three quarters of any block's calls is dropped (the 2-core VM is shared; an
OpenMP team then waits out another process's time slice). Also printed: each flush's
duration, minor page faults per timed call (read around the call in a separate pass) and the thread facts.

Usage: python3 bench/explore/cpu_call_gap.py [--case rmsnorm|relu|softmax] [--reps 30] [--calls 40]
                                             [--flushes old,kforge] [--loops plain,pre,ub,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]

CASES = {  # name -> (candidate file, input shape: the problem pack's)
    "rmsnorm": ("tests/candidates/cpu_omp_rmsnorm.py", (16, 64, 32, 32)),
    "relu": ("tests/adversarial/candidates/honest_cpp_relu.py", (1024, 1024)),
    "softmax": ("tests/candidates/cpu_omp_softmax.py", (256, 4096)),
}


def load_model(case: str) -> tuple[Any, Any]:
    """The candidate's ModelNew (load_inline builds it) and an input of the problem's shape."""
    import torch

    path, shape = CASES[case]
    ns: dict[str, Any] = {}
    exec(compile((ROOT / path).read_text(), path, "exec"), ns)  # noqa: S102 - this repository's test candidate
    return ns["ModelNew"](*([shape[1]] if case == "rmsnorm" else [])), torch.randn(*shape)


def flushes() -> dict[str, Callable[[], None]]:
    import torch

    from kforge.backends.cpu import CpuBackend

    buf = torch.empty(64 * 2**20)  # 256 MiB of float32
    small = buf[: 16 * 2**20]
    halves = small.split(4 * 2**20)  # 16 MiB chunks

    def twice16() -> None:
        for part in halves:
            part.fill_(1.0)
            part.fill_(2.0)

    return {"old": lambda: small.fill_(1.0), "kforge": CpuBackend().flush_cache,
            "single256": lambda: buf.fill_(1.0), "add64": lambda: small.add_(1.0), "twice64c16": twice16}


def median_ci(xs: list[float]) -> tuple[float, float, float]:
    """Median and a ~95% order-statistics interval of it."""
    s, n = sorted(xs), len(xs)
    k = max(0, int(n / 2 - 0.98 * n ** 0.5))
    return statistics.median(s), s[k], s[min(n - 1, n - 1 - k)]


def _switches() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def make_loops(model: Any, x: Any, flush: Callable[[], None], calls: int) -> dict[str, Callable[[], tuple[list, list]]]:
    """Each loop returns (per-call seconds, per call: did another process take a CPU from this one meanwhile)."""
    import torch
    from torch.utils import benchmark

    from kforge.backends.cpu import CpuBackend
    from kforge.tools.harness.bench import _REVALIDATED_CALLS, _Reservoir
    from kforge.tools.harness.timing import ReplaySchedule, TimingPolicy, time_model

    backend = CpuBackend()
    backend.flush_cache = flush  # type: ignore[method-assign] - the flush under study
    sets = [x] + [torch.randn_like(x) for _ in range(3)]
    ub = benchmark.Timer("m(x)", setup="flush()", globals={"m": model, "x": x, "flush": flush},
                         num_threads=torch.get_num_threads())

    def plain(arg: Callable[[int], Any] = lambda i: x, keep: bool = False, pre: bool = False,
              timer: Any = None, nograd: bool = False) -> tuple[list, list]:
        out, held, hit = [], None, []
        for i in range(calls):
            a = arg(i)
            held = None  # the worker's make_args drops the held output before the next input
            if pre:
                model(x)
                model(x)
            flush()
            s0 = _switches()
            if nograd:
                t0 = time.perf_counter()
                with torch.no_grad():
                    y = model(a)
                t1 = time.perf_counter()
                out.append(t1 - t0)
            elif timer is None:
                t0 = time.perf_counter()
                y = model(a)
                t1 = time.perf_counter()
                out.append(t1 - t0)
            else:
                t = timer()
                t.start()
                y = model(a)
                t.stop()
                out.append(t.elapsed_s())
            hit.append(_switches() > s0)
            if keep:
                held = y
            del y, a
        del held
        return out, hit

    def through_ub() -> tuple[list, list]:
        out, hit = [], []
        for _ in range(calls):
            s0 = _switches()
            out.append(ub.timeit(1).median)
            hit.append(_switches() > s0)  # anywhere in timeit(1), its untimed calls included: conservative
        return out, hit

    timers: list[Any] = []
    backend.timer = lambda: timers.append(CpuBackend.timer(backend)) or timers[-1]  # type: ignore[method-assign]

    def kforge(copy: bool) -> tuple[list, list]:
        keep = _Reservoir(_REVALIDATED_CALLS)

        def make_args(i: int) -> list[Any]:
            keep.drop_last()
            return [sets[i].clone()] if copy else [sets[i]]

        policy = TimingPolicy(min_samples=calls, max_samples=calls, target_rel_ci=0.0, budget_s=1e9,
                              warmup_calls=1, warmup_s=0.0, checked_calls=3)
        timers.clear()
        samples = time_model("x", model, make_args, backend, policy, schedule=ReplaySchedule(4),
                             on_output=keep.offer).samples_s
        return samples, [t.preemptions > 0 for t in timers[-len(samples):]]  # the sampled calls' timers

    return {
        "plain": lambda: plain(),
        "pre": lambda: plain(pre=True),
        "ub": through_ub,
        "clone": lambda: plain(arg=lambda i: x.clone()),
        "keep": lambda: plain(keep=True),
        "sets": lambda: plain(arg=lambda i: sets[i % 4]),
        "cputimer": lambda: plain(timer=backend.timer),
        "nograd": lambda: plain(nograd=True),
        "kforge": lambda: kforge(True),
        "kforge-nocopy": lambda: kforge(False),
    }


def faults_per_call(model: Any, x: Any, flush: Callable[[], None], calls: int) -> dict[str, float]:
    """Minor page faults per call, read around the call itself: one input, and the worker's pattern (a fresh
    input copy per call, the output held until the next copy is made)."""
    res = {}
    for name, copy in (("plain", False), ("copy+keep", True)):
        per, held = [], None
        for _ in range(calls):
            a = x.clone() if copy else x
            held = None
            flush()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            y = model(a)
            per.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            held = y if copy else None
            del y, a
        del held
        res[name] = statistics.median(per)
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="rmsnorm", choices=list(CASES))
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--flushes", type=lambda s: s.split(","), default=["old", "kforge"])
    p.add_argument("--loops", type=lambda s: s.split(","), default=None)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()

    import torch

    from kforge.backends.cpu import CpuBackend, flush_plan, openmp_runtimes

    CpuBackend().setup()  # as a worker: thread count, OMP_NUM_THREADS, malloc thresholds
    torch.manual_seed(0)
    model, x = load_model(a.case)
    all_flushes = flushes()
    loops: dict[str, Callable[[], tuple[list, list]]] = {}
    for f in a.flushes:
        made = make_loops(model, x, all_flushes[f], a.calls)
        loops.update({f"{f}:{n}": made[n] for n in (a.loops or list(made))})
    names = list(loops)
    facts: dict[str, Any] = {"case": a.case, "threads": torch.get_num_threads(), "openmp": openmp_runtimes(),
                             "affinity": sorted(os.sched_getaffinity(0)), "nice": os.nice(0),
                             "kforge_flush_plan_bytes": flush_plan()}
    with torch.no_grad():
        for name in names:  # warm every loop once (allocator growth, first calls)
            loops[name]()
        facts["faults_per_call"] = {f: faults_per_call(model, x, all_flushes[f], a.calls) for f in a.flushes}
        facts["flush_ms"] = {}
        for f in a.flushes:
            t0 = time.perf_counter()
            for _ in range(20):
                all_flushes[f]()
            facts["flush_ms"][f] = round((time.perf_counter() - t0) / 20 * 1e3, 3)
        print(json.dumps(facts), flush=True)
        per_rep: dict[str, list[float]] = {n: [] for n in names}
        dropped = 0
        for _ in range(a.reps):
            order = names[:]
            random.shuffle(order)
            got, clean = {}, True
            for name in order:
                samples, hit = loops[name]()
                kept = [s for s, h in zip(samples, hit) if not h]
                clean &= len(kept) >= len(samples) // 4
                got[name] = statistics.median(kept or samples)
            if not clean:
                dropped += 1
                continue
            for name in names:
                per_rep[name].append(got[name])
    kept = a.reps - dropped
    print(f"{a.case}: {kept} of {a.reps} repetitions kept ({dropped} contended), {a.calls} calls per block; "
          "ratio = loop / plain under the same flush, paired per repetition")
    print(f"{'flush:loop':22s} {'median us':>10s} {'ratio':>7s}   95% CI of ratio")
    summary = {}
    for name in names:
        if not per_rep[name]:
            continue
        base = per_rep[name.split(":")[0] + ":plain"] if name.split(":")[0] + ":plain" in per_rep else per_rep[name]
        r, lo, hi = median_ci([v / b for v, b in zip(per_rep[name], base)])
        summary[name] = {"median_us": round(statistics.median(per_rep[name]) * 1e6, 2), "ratio": round(r, 4),
                         "ci": [round(lo, 4), round(hi, 4)]}
        print(f"{name:22s} {summary[name]['median_us']:10.1f} {r:7.3f}   [{lo:.3f}, {hi:.3f}]")
    if a.json:
        a.json.write_text(json.dumps({"facts": facts, "reps_kept": kept, "reps": a.reps, "calls": a.calls,
                                      "summary": summary, "per_rep": per_rep}, indent=1))


if __name__ == "__main__":
    main()
