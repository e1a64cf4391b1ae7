"""A/B of the torch.compile baseline compiled ahead (KFORGE_WARM_BASELINES) on real KernelBench problems.

On a host with two GPUs, runs bench/kernelbench_sample.py twice side by side, one server per GPU, one with the
warm-up off and one with it on (`gpu`); then again with every problem's first call a compile_kernel with the
reference (--compile-first), the GPUs swapped so that neither setting keeps one GPU. Each sample also times the
problems with KernelBench's harness, do_bench and ncu in the same run. Prints and writes one table: each problem's
first candidate (compile,) verify and profile, the warm-up's outcome from the server's trace, and the harness's time.

  python3 bench/warmup_ab.py --problems level1/1 level1/40 level2/12 --out $OUT   # from bench/run_kernelbench_sample.sh's env
  python3 bench/warmup_ab.py --sample-args --turn-s 5 --ncu-clocks none            # an agent's 5 s turn before each first profile
  python3 bench/warmup_ab.py --settings gpu timed --flows verify-first --sample-args --turn-s 5 --ncu-clocks none
                                                    # the warm-up that also times its baseline (KFORGE_WARM_TIMING)
  python3 bench/warmup_ab.py --summarize DIR                                       # the table again from DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Each setting's server environment: the warm-up off, on (compile only), or on and timing its baseline too.
SETTINGS = {"off": ["KFORGE_WARM_BASELINES=off"], "gpu": ["KFORGE_WARM_BASELINES=gpu", "KFORGE_WARM_TIMING=0"],
            "timed": ["KFORGE_WARM_BASELINES=gpu", "KFORGE_WARM_TIMING=1"]}  # timed: the defaults


def run_pair(flow: str, problems: list[str], out: Path, extra: list[str], swap: bool, settings: list[str]) -> None:
    procs = []
    for gpu, setting in enumerate(reversed(settings) if swap else settings):
        d = out / f"{flow}-{setting}"
        d.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(HERE / "kernelbench_sample.py"), "--kernelbench", str(HERE.parent / ".kb"),
               "--problems", *problems, "--out", str(d), "--state", str(d / "state.json"),
               "--server-env", *SETTINGS[setting], *extra]
        if flow == "compile-first":
            cmd.append("--compile-first")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        print(f"[{time.strftime('%H:%M:%S')}] {flow} {setting} on GPU {gpu}", flush=True)
        procs.append(subprocess.Popen(cmd, env=env, stdout=open(d / "log.txt", "w"), stderr=subprocess.STDOUT))
    for p in procs:
        p.wait()


def _warmups(trace: Path) -> dict[str, str]:
    """The warm-up's outcome per reference, in the order the trace met them (one problem after another)."""
    outcomes = []
    if trace.exists():
        for line in trace.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("op") == "warmup.torch_compile":
                outcomes.append(f"{rec.get('outcome')} ({rec.get('s')} s)")
    return outcomes


def warm_of(warm: list[str], i: int, rows: int) -> str:
    """One warm-up per problem, in order, where the server started one for each; else all of them on the first row."""
    if len(warm) == rows:
        return warm[i]
    return ", ".join(warm) or "-" if i == 0 else ""


def summarize(out: Path) -> str:
    lines = ["| flow | setting | problem | compile s | verify s | profile s | (c+)v+p s | KB harness s | (v+p)/KB | "
             "warm-up (s) | KF median us | do_bench us |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for flow in ("verify-first", "compile-first"):
        for setting in SETTINGS:
            d = out / f"{flow}-{setting}"
            js = [p for p in d.glob("kernelbench-sample*.json")] if d.exists() else []
            if not js:
                continue
            res = json.loads(js[0].read_text())
            traces = list(d.glob("*-trace.jsonl"))
            warm = _warmups(traces[0]) if traces else []
            for i, r in enumerate(res["rows"]):
                c, v, p = r.get("compile_s"), r.get("verify_s"), r.get("profile_s")
                kb = (r.get("local") or {}).get("kb_harness_s")
                vp = (v or 0) + (p or 0) if p else None
                cvp = (c or 0) + vp if vp is not None else None
                med = ((r.get("profile") or {}).get("candidate") or {}).get("median_us")
                db = (r.get("local") or {}).get("do_bench_median_us")
                f = lambda x, nd=2: "-" if x is None else f"{x:.{nd}f}"  # noqa: E731
                lines.append(f"| {flow} | {setting} | {r['problem']} | {f(c)} | {f(v)} | {f(p)} | {f(cvp)} | {f(kb)} | "
                             f"{f(vp / kb if vp and kb else None)} | {warm_of(warm, i, len(res['rows']))} | "
                             f"{f(med, 1)} | {f(db, 1)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", nargs="+", default=["level1/1", "level1/40", "level2/12", "level2/76"])
    ap.add_argument("--settings", nargs=2, default=["off", "gpu"], choices=list(SETTINGS),
                    help="the two settings side by side, one per GPU (default: off gpu)")
    ap.add_argument("--flows", nargs="+", default=["verify-first", "compile-first"],
                    choices=["verify-first", "compile-first"])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or HERE / "out"))
    ap.add_argument("--summarize", type=Path, help="only print the table of an earlier run's folder")
    ap.add_argument("--sample-args", nargs=argparse.REMAINDER, default=["--ncu-clocks", "none"],
                    help="the rest goes to kernelbench_sample.py")
    args = ap.parse_args()
    if not args.summarize:
        for i, flow in enumerate(args.flows):
            run_pair(flow, args.problems, args.out, args.sample_args, swap=i % 2 == 1, settings=args.settings)
    table = summarize(args.summarize or args.out)
    print(table)
    (args.summarize or args.out).joinpath("warmup-ab.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
