"""Why two processes timing the same host-paced network disagree (the level-3 sweep, 2026-12-01).

In `kernelbench_sample.py --sweep` on level 3 (one H200, 16 cores), KernelBench networks of 87-835 kernel launches
a call (EfficientNet, MobileNet, GoogleNet, ResNet, DenseNet at batch 10) timed 0.50-1.54x against themselves: the
candidate process and the judge process running the same model each held a steady pace of their own (EfficientNetB1
1,941 us against 2,995 us, IQRs 8% wide), and KForge's medians were 0.82-1.20x do_bench's. This times such a network
in fresh processes, one at a time, each on the host's cores as the scheduler gives them and then pinned to one core
after another (taskset), and prints what decides a host-paced call: do_bench's median, the host's time to issue one
call, the CPU it ran on and its clock, do_bench with Python's collector off, KForge's own timing loop in the same
process (kforge importable: scripts' /tmp/kforge-pkg), and the host's topology (NUMA nodes, the GPU's local
cores, SMT siblings).

    python3 bench/explore/host_pace.py --problem .kb/KernelBench/level3/23_EfficientNetB1.py [--unpinned 6]
        [--cores all|0,1,8|none] [--seccomp-alternate N] [--smi-alternate N] [--profiled-alternate N] --out DIR

What it found (H200, 2026-12-01, bench/results/host-pace-h200-2026-12-01-s32-*): the host issues launches at two
paces, 5.5-6.2 us and 7.8-10 us a launch, from one fresh process to the next and within one, pinned or not, and
do_bench moves with it (1.86-2.05x between processes); Python's collector, the CPU core, KForge's system-call filter
and the bench's nvidia-smi polling made no difference. KForge's own loop agrees with do_bench in the same process.
KForge's workers read 13.1-13.7 us a launch: --profiled-alternate found the cause (2026-12-02,
host-pace-h200-2026-12-02-s33.md): after two torch.profiler sessions with CUPTI left attached a launch cost 13-14 us
in three processes of four, 6.9-9.2 us with TEARDOWN_CUPTI=1, and a session after a teardown re-started CUPTI in
~0.02 s. GPU workers now set TEARDOWN_CUPTI=1 (`backends/_nvidia.py::setup_gpu`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def one(path: str, filtered: bool = False) -> dict:
    """In this process: the model at its published size, do_bench's median, the host's issue time of one call.
    `filtered`: first load a system-call filter as KForge's sandbox does (libseccomp, allow by default, one rule):
    Linux may then force the process's speculation mitigations on (Speculative Store Bypass, indirect branches)."""
    if filtered:
        import errno

        import pyseccomp as seccomp
        rules = seccomp.SyscallFilter(seccomp.ALLOW)
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "ptrace")
        rules.load()
    import torch
    import triton.testing
    if os.environ.get("HOST_PACE_PROFILED"):  # as KForge's workers warm up (`_warm_device`): a torch.profiler session
        # first. Kineto leaves CUPTI attached after it unless TEARDOWN_CUPTI=1 (pytorch/pytorch#144455: 10-20% slower
        # training after profiling ended); KForge's workers read 13.1-13.7 us a launch where fresh processes read 5.5-10.
        profiler_s = [profiler_session()]  # what it costs: the first in a process starts CUPTI
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    ns: dict = {}
    exec(compile(Path(path).read_text(), path, "exec"), ns)
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]()).cuda()
    torch.manual_seed(0)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
    out = {"cpu_start": getcpu(), "affinity": sorted(os.sched_getaffinity(0))}
    with torch.no_grad():
        for _ in range(5):
            model(*inputs)
        torch.cuda.synchronize()
        out["do_bench_us"] = round(triton.testing.do_bench(lambda: model(*inputs), return_mode="median") * 1e3, 1)
        issue = []
        for _ in range(30):  # host time to issue one call, the device idle before it (a sync between)
            torch.cuda.synchronize()
            t = time.perf_counter()
            model(*inputs)
            issue.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        out["issue_us"] = round(statistics.median(issue) * 1e6, 1)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        back = []
        for _ in range(30):  # back to back, no flush: the pace a stream of calls keeps
            ev[0].record()
            model(*inputs)
            ev[1].record()
            ev[1].synchronize()
            back.append(ev[0].elapsed_time(ev[1]) * 1e3)
        out["event_us"] = round(statistics.median(back), 1)
        # Python's collector walks every live object of a generation; a process with more of them (a judge holding
        # its problem) would pay more per call of a network that makes many temporaries.
        gc.collect()
        gc.disable()
        out["do_bench_gc_off_us"] = round(triton.testing.do_bench(lambda: model(*inputs), return_mode="median") * 1e3, 1)
        gc.enable()
        out["kforge_us"] = kforge_median_us(model, inputs)  # KForge's own loop, same process, same inputs
        out["do_bench_after_us"] = round(triton.testing.do_bench(lambda: model(*inputs), return_mode="median") * 1e3, 1)
        # Does a cheap probe of the host's speed, read just before, follow the pace do_bench then measures? (a pace
        # that changes inside one process, as do_bench before and after show, is the host's, not the model's)
        small = torch.zeros(1, device="cuda")
        out["pairs"] = []
        for _ in range(8):
            cpu_us, launch_us = host_probe(small)
            db = triton.testing.do_bench(lambda: model(*inputs), return_mode="median") * 1e3
            out["pairs"].append([round(cpu_us, 1), round(launch_us, 2), round(db, 1)])
        if os.environ.get("HOST_PACE_PROFILED"):  # a second session: what CUPTI's start costs again once torn down,
            profiler_s.append(profiler_session())  # and the launch cost after it
            out["launch_after_second_profile_us"] = round(host_probe(small)[1], 2)
            out["profiler_s"] = [round(t, 3) for t in profiler_s]
    out["cpu_end"] = getcpu()
    out["speculation"] = "; ".join(ln.split(":", 1)[1].strip() for ln in Path("/proc/self/status").read_text().splitlines()
                                   if ln.startswith("Speculation"))
    out["mhz"] = core_mhz(out["cpu_end"])
    return out


def profiler_session() -> float:
    """One torch.profiler session of CPU and CUDA activity around a small launch, as KForge's `_warm_device`; its s."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        (torch.ones(256, device="cuda") + 1).sum()
        torch.cuda.synchronize()
    return time.perf_counter() - t


def host_probe(small) -> tuple[float, float]:
    """The host's speed now: a pure-Python loop (us, best of 5) and one kernel launch's host cost (us, median of
    5 bursts of 50 launches of a one-element fill, no sync inside a burst)."""
    import torch
    loops, launches = [], []
    for _ in range(5):
        t = time.perf_counter()
        sum(range(20000))
        loops.append((time.perf_counter() - t) * 1e6)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(50):
            small.zero_()
        launches.append((time.perf_counter() - t) * 1e6 / 50)
    torch.cuda.synchronize()
    return min(loops), statistics.median(launches)


def getcpu() -> int:
    """The CPU this thread runs on (glibc's sched_getcpu: Python's os module has none)."""
    import ctypes
    return ctypes.CDLL(None).sched_getcpu()


def kforge_median_us(model, inputs) -> float | str:
    """KForge's timing loop (tools/harness/timing.py) on the CUDA backend, 1 s budget: what a profile's round does."""
    try:
        from kforge.backends.cuda import CudaBackend
        from kforge.tools.harness.timing import TimingPolicy, time_model
    except Exception as exc:  # noqa: BLE001 - kforge not importable here: the run still has do_bench's numbers
        return f"kforge not importable: {exc!r}"[:200]
    timed = time_model("candidate", model, lambda i: inputs, CudaBackend(), TimingPolicy(budget_s=1.0))
    return round(timed.stats.median_us, 1)


def core_mhz(cpu: int) -> float | None:
    """The core's current clock as the kernel reads it (cpufreq, else /proc/cpuinfo's block for that CPU)."""
    try:
        return int(Path(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq").read_text()) / 1000
    except (OSError, ValueError):
        pass
    try:
        block = Path("/proc/cpuinfo").read_text().split("\n\n")[cpu]
        return float(next(ln.split(":")[1] for ln in block.splitlines() if ln.startswith("cpu MHz")))
    except (OSError, IndexError, StopIteration, ValueError):
        return None


def topology() -> dict:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception as exc:  # noqa: BLE001
            return repr(exc)
    return {"lscpu": sh("lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA|MHz|Hypervisor'"),
            "vulnerabilities": sh("grep -r . /sys/devices/system/cpu/vulnerabilities/ 2>/dev/null | sed 's|.*/||'"),
            "numa": sh("cat /sys/devices/system/node/node*/cpulist 2>/dev/null"),
            "siblings": sh("cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list 2>/dev/null "
                           "| sort -u | tr '\\n' ' '"),
            "gpu_topo": sh("nvidia-smi topo -m 2>/dev/null | head -5"),
            "governor": sh("cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null"),
            "load": sh("cat /proc/loadavg")}


def run_one(problem: str, core: int | None, filtered: bool = False, env: dict | None = None) -> dict:
    cmd = [sys.executable, __file__, "--_one" + ("_filtered" if filtered else ""), problem]
    if core is not None:
        cmd = ["taskset", "-c", str(core)] + cmd
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, **(env or {})})
    try:
        got = json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        got = {"error": (res.stdout + res.stderr)[-800:]}
    return {"core": core, **got, "process_s": round(time.perf_counter() - t, 1)}


class SmiPoller:
    """What bench/kernelbench_sample.py's GpuMemory runs beside every KForge call it measures: `nvidia-smi -lms 100`,
    and `nvidia-smi --query-compute-apps` one after another (50 ms apart). Its do_bench runs outside them."""

    def __enter__(self):
        import threading
        self.lms = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used,clocks.sm", "--format=csv,noheader",
                                     "-lms", "100"], stdout=subprocess.DEVNULL)
        self.stop = threading.Event()

        def apps() -> None:
            while not self.stop.is_set():
                subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                               capture_output=True, timeout=10)
                self.stop.wait(0.05)
        self.thread = threading.Thread(target=apps, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.lms.terminate()
        self.lms.wait()
        self.thread.join(timeout=15)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] in ("--_one", "--_one_filtered"):
        print(json.dumps(one(sys.argv[2], filtered=sys.argv[1] == "--_one_filtered")))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", nargs="+", required=True)
    ap.add_argument("--unpinned", type=int, default=6)
    ap.add_argument("--cores", default="all", help="'none': no pinned runs")
    ap.add_argument("--seccomp-alternate", type=int, default=0,
                    help="N more unpinned runs, each run once plain and once under a system-call filter (pyseccomp)")
    ap.add_argument("--profiled-alternate", type=int, default=0,
                    help="N more unpinned runs of three: plain, after a torch.profiler session (as KForge's workers "
                         "warm up), and the same with TEARDOWN_CUPTI=1")
    ap.add_argument("--smi-alternate", type=int, default=0,
                    help="N more unpinned runs, each run once alone and once beside the bench's nvidia-smi polling")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/out")))
    args = ap.parse_args()
    cores = (sorted(os.sched_getaffinity(0)) if args.cores == "all" else [] if args.cores == "none" else
             [int(c) for c in args.cores.split(",")])
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "topology": topology(), "runs": {}}
    print(json.dumps(res["topology"], indent=1), flush=True)
    lines = []
    for problem in args.problem:
        runs = [run_one(problem, None) for _ in range(args.unpinned)] + [run_one(problem, c) for c in cores]
        for _ in range(args.seccomp_alternate):
            runs.append({**run_one(problem, None), "core": "no filter"})
            runs.append({**run_one(problem, None, filtered=True), "core": "system-call filter"})
        for _ in range(args.profiled_alternate):  # plain; after a profiler session; the same with CUPTI torn down
            runs.append({**run_one(problem, None), "core": "plain"})
            runs.append({**run_one(problem, None, env={"HOST_PACE_PROFILED": "1"}), "core": "after torch.profiler"})
            runs.append({**run_one(problem, None, env={"HOST_PACE_PROFILED": "1", "TEARDOWN_CUPTI": "1"}),
                         "core": "after torch.profiler, TEARDOWN_CUPTI=1"})
        for _ in range(args.smi_alternate):
            runs.append({**run_one(problem, None), "core": "alone"})
            with SmiPoller():
                runs.append({**run_one(problem, None), "core": "nvidia-smi polling"})
        res["runs"][problem] = runs
        name, start = Path(problem).stem, len(lines)
        lines += [f"## {name}", "", "| pinned to | CPU at start/end | MHz | do_bench us | do_bench, GC off | KForge loop us | do_bench after | "
                  "issue us (host, one call) | back-to-back event us | process s | speculation (/proc/self/status) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in runs:
            lines.append(f"| {'-' if r['core'] is None else r['core']} | {r.get('cpu_start')}/{r.get('cpu_end')} | "
                         f"{r.get('mhz')} | {r.get('do_bench_us')} | {r.get('do_bench_gc_off_us')} | {r.get('kforge_us')} | "
                         f"{r.get('do_bench_after_us')} | {r.get('issue_us')} | {r.get('event_us')} | {r['process_s']} | "
                         f"{r.get('speculation', '')} |"
                         + (f" {r['error'][-200:]}" if r.get("error") else "")
                         + (f" profiler sessions {r['profiler_s']} s, a launch after the second "
                            f"{r['launch_after_second_profile_us']} us" if r.get("profiler_s") else ""))
        lines += ["", "probe then do_bench, in each process: (python loop us, one launch us, do_bench us)", ""]
        lines += [f"- {'-' if r['core'] is None else r['core']}: " + ", ".join(f"({a}, {b}, {c})" for a, b, c in r["pairs"])
                  for r in runs if r.get("pairs")]
        db = [r["do_bench_us"] for r in runs if r.get("do_bench_us")]
        if db:
            lines += ["", f"do_bench over processes: min {min(db)}, median {statistics.median(db)}, max {max(db)} us "
                          f"(max/min {max(db) / min(db):.3f})", ""]
        print("\n".join(lines[start:]), flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host-pace.json").write_text(json.dumps(res, indent=1))
        (args.out / "host-pace.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
