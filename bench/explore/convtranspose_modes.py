"""Why does level1/57's ConvTranspose2d run at two speeds? (issue 16, must-hold 1)

KernelBench level1/57 (ConvTranspose2d 64->64, 3x3, 8x64x1024x1024 fp32) ran at 27 ms and at 42 ms in one process:
KForge's samples spanned both (IQR 31% of the median, untrusted), do_bench and ncu each caught another mix. NVML read
1980 MHz and no slowdown reason through it, so it is not a clock or power cap. Leads: the algorithm cuDNN picks (per
process, per free workspace, per precision flag), the input's address or values, idle gaps between calls.

Each condition runs in a fresh process (cuDNN's choice is cached per process) and reports:

- `same`: 30 calls back to back on one input, each timed by CUDA events;
- `alternate`: 20 calls alternating two inputs at different addresses (KForge rotates input sets);
- `gapped`: 12 calls with a host sync and a 50 ms sleep before each (ncu's replays leave the GPU idle between);
- `graph`: 10 replays of the call captured as a CUDA graph (no host launches), where cuDNN allows the capture;
- the kernels each call launched and their durations (torch.profiler), so a change of speed can be told apart from a
  change of kernel; the streams they ran on and the span they covered against the sum of their durations (overlap);
- the host's time to issue one call (`host_issue`), on a free core, pinned to one core, and sharing that core with a
  process that spins (launch-bound work slows with the host, a kernel's own time does not).

    python3 bench/explore/convtranspose_modes.py --kernelbench .kb --problem level1/57 --out DIR
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
path, cfg = sys.argv[1], json.loads(sys.argv[2])
torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = cfg["tf32"]
torch.backends.cudnn.benchmark = cfg["benchmark"]
spec = importlib.util.spec_from_file_location("problem", path)
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
torch.manual_seed(0)
model = mod.Model(*mod.get_init_inputs()).cuda()
torch.manual_seed(1)
xs = [a.cuda() for a in (mod.get_inputs()[0], mod.get_inputs()[0])]
if cfg["data"] == "zeros":
    for x in xs: x.zero_()
elif cfg["data"] == "randn":
    for x in xs: x.normal_()
reserve = None
if cfg.get("leave_free_gb") is not None:
    free, _ = torch.cuda.mem_get_info()
    take = free - int(cfg["leave_free_gb"] * 2**30)
    if take > 0:
        reserve = torch.empty(take, dtype=torch.uint8, device="cuda")

def time_calls(inputs, gap_s=0.0):
    out = []
    for x in inputs:
        if gap_s:
            torch.cuda.synchronize(); time.sleep(gap_s)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); model(x); e.record()
        out.append((s, e))
    torch.cuda.synchronize()
    return [round(s.elapsed_time(e) * 1e3, 1) for s, e in out]

res = {"cfg": cfg, "cudnn": torch.backends.cudnn.version(), "x_ptrs": [hex(x.data_ptr()) for x in xs]}
with torch.no_grad():
    t = time.perf_counter(); time_calls(xs[:1]); res["first_call_s"] = round(time.perf_counter() - t, 3)
    time_calls([xs[0]] * 3)
    res["same"] = time_calls([xs[0]] * 30)
    alt = time_calls([xs[i % 2] for i in range(20)])
    res["alternate_a"], res["alternate_b"] = alt[0::2], alt[1::2]
    res["gapped"] = time_calls([xs[0]] * 12, gap_s=0.05)
    issue = []
    for _ in range(8):
        torch.cuda.synchronize(); t = time.perf_counter(); model(xs[0]); issue.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    res["host_issue"] = [round(x * 1e6, 1) for x in issue]
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            model(xs[0])
        g.replay(); torch.cuda.synchronize()
        pairs = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); g.replay(); e.record(); pairs.append((s, e))
        torch.cuda.synchronize()
        res["graph"] = [round(s.elapsed_time(e) * 1e3, 1) for s, e in pairs]
        del g
    except Exception as exc:  # cuDNN may refuse the capture
        res["graph_error"] = repr(exc)[:300]
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(8):
            model(xs[i % 2])
        torch.cuda.synchronize()
    kernels = [(e.time_range.start, e.name, e.time_range.elapsed_us()) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort()
    by_name = {}
    for _, name, us in kernels:
        by_name.setdefault(name[:140], []).append(us)
    # per distinct kernel: launches in the 8 calls, and its duration's min, median and max (us)
    res["kernels"] = {k: [len(v), round(min(v), 1), round(statistics.median(v), 1), round(max(v), 1)]
                      for k, v in by_name.items()}
    import os, tempfile
    trace = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(trace)
    ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("cat") == "kernel"]
    res["streams"] = sorted({e.get("args", {}).get("stream") for e in ev}, key=str)
    if ev:
        span = max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)
        res["kernel_span_ms_per_call"] = round(span / 8 / 1e3, 2)
        res["kernel_sum_ms_per_call"] = round(sum(e["dur"] for e in ev) / 8 / 1e3, 2)
res["free_gb_after"] = round(torch.cuda.mem_get_info()[0] / 2**30, 1)
res["max_reserved_gb"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
print(json.dumps(res))
"""

CONDITIONS = [
    {"name": "kforge flags (TF32 off), rand, 1", "tf32": False, "benchmark": False, "data": "rand"},
    {"name": "kforge flags (TF32 off), rand, 2", "tf32": False, "benchmark": False, "data": "rand"},
    {"name": "TF32 on (torch's default, the harness)", "tf32": True, "benchmark": False, "data": "rand"},
    {"name": "cudnn.benchmark", "tf32": False, "benchmark": True, "data": "rand"},
    {"name": "8 GB left free", "tf32": False, "benchmark": False, "data": "rand", "leave_free_gb": 8},
    {"name": "1 GB left free", "tf32": False, "benchmark": False, "data": "rand", "leave_free_gb": 1},
    {"name": "zeros", "tf32": False, "benchmark": False, "data": "zeros"},
    {"name": "randn", "tf32": False, "benchmark": False, "data": "randn"},
    {"name": "pinned to one core", "tf32": False, "benchmark": False, "data": "rand", "cpu": "3"},
    {"name": "one core shared with a spinning process", "tf32": False, "benchmark": False, "data": "rand", "cpu": "3",
     "contend": True},
]


def _summary(times: list[float]) -> str:
    if not times:
        return "-"
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return f"{statistics.median(times) / 1e3:.1f} ({min(times) / 1e3:.1f}-{max(times) / 1e3:.1f}, IQR {q[0] / 1e3:.1f}-{q[2] / 1e3:.1f})"


def _kernel_table(kernels: dict) -> list[str]:
    """Distinct kernels with their launches and duration (us: median, min-max)."""
    return [f"  - {n}x {med:g} us ({lo:g}-{hi:g}) `{k}`" for k, (n, lo, med, hi) in kernels.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", type=Path, required=True)
    ap.add_argument("--problem", default="level1/57")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--conditions", nargs="+", default=[""], help="run the conditions whose name holds one of these")
    args = ap.parse_args()
    path = problem_path(args.kernelbench, args.problem)
    rows = []
    for cond in [c for c in CONDITIONS if any(w in c["name"] for w in args.conditions)]:
        pin = ["taskset", "-c", cond["cpu"]] if cond.get("cpu") else []
        spinner = subprocess.Popen(pin + [sys.executable, "-c", "while True: pass"]) if cond.get("contend") else None
        try:
            proc = subprocess.run(pin + [sys.executable, "-c", _CHILD, str(path), json.dumps(cond)], capture_output=True,
                                  text=True, timeout=240)
        finally:
            if spinner is not None:
                spinner.kill()
        if proc.returncode != 0:
            rows.append({"cfg": cond, "error": proc.stderr[-3000:]})
        else:
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1])[:400], flush=True)
    lines = [f"{args.problem}: one call's time in ms, median (min-max, IQR), per condition, each a fresh process", "",
             "| condition | first call s | same input x30 | alternating: input A | input B | gapped 50 ms x12 | CUDA graph x10 "
             "| host issue x8 | kernels: span / sum of durations per call, streams | max reserved GB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['cfg']['name']} | error | | | | | | | | |")
            continue
        lines.append(f"| {r['cfg']['name']} | {r['first_call_s']} | {_summary(r['same'])} | {_summary(r['alternate_a'])} | "
                     f"{_summary(r['alternate_b'])} | {_summary(r['gapped'])} | "
                     f"{_summary(r['graph']) if 'graph' in r else r.get('graph_error', '-')} | "
                     f"{_summary(r.get('host_issue', []))} | {r.get('kernel_span_ms_per_call')} / "
                     f"{r.get('kernel_sum_ms_per_call')} ms, {len(r.get('streams', []))} | {r['max_reserved_gb']} |")
    lines.append("")
    for r in rows:
        if "error" in r:
            lines += [f"- {r['cfg']['name']}: error", "```", r["error"][-1500:], "```"]
            continue
        lines.append(f"- {r['cfg']['name']}: kernels of 8 profiled calls (cuDNN {r['cudnn']})")
        lines += _kernel_table(r["kernels"])
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "convtranspose-modes.json").write_text(json.dumps({"problem": args.problem, "rows": rows}, indent=1))
    (args.out / "convtranspose-modes.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
