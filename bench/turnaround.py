"""Turnaround and timing-noise benchmark: prints a table and writes JSON + Markdown results.

Per candidate, in one run and on one machine:
  * plain `load_inline` in a fresh Python process (the field's baseline: what KernelBench pays),
  * KForge compile_kernel cold (empty build cache) and again from the build cache,
  * verify_against_reference and profile_kernel wall time;
then the same kernel profiled N times in separate calls (median and spread of the medians).

Usage: python bench/turnaround.py --backend cuda [--out DIR] [--noise-runs 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
CANDIDATES = HERE.parent / "tests" / "candidates"
SETS = {
    "cuda": [("elementwise relu", "relu", None)],
    "cpu": [("fused elementwise", None, None)],  # the example's own reference
}


def plain_load_inline_s(candidate: Path) -> float:
    """Seconds for a fresh interpreter to import the candidate with stock load_inline (cold build dir)."""
    with tempfile.TemporaryDirectory() as tmp:
        code = textwrap.dedent(f"""
            import os, time, runpy
            os.environ["TORCH_EXTENSIONS_DIR"] = {tmp!r}
            t = time.perf_counter(); import torch; runpy.run_path({str(candidate)!r}); print(time.perf_counter() - t)
        """)
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        return time.perf_counter() - t0


async def measure(backend: str, noise_runs: int, home: Path) -> dict:
    from kforge.server.catalog import example, problem_reference
    from kforge.tools.context import ToolContext
    from kforge.tools.evaluate import compile_kernel, verify_against_reference
    from kforge.tools.profile import profile_kernel

    ctx = ToolContext(home=home)
    avail = await ctx.require_backend(backend)
    rows = []
    for label, problem, cand_name in SETS[backend]:
        # cand_name None: the backend's served example; its reference, or the named problem's.
        ref = problem_reference(problem) if problem else example(backend)["reference"]
        cand_path = (CANDIDATES / f"{cand_name}.py" if cand_name
                     else HERE.parent / "resources" / "examples" / backend / "candidate.py")
        cand = cand_path.read_text()
        plain = plain_load_inline_s(cand_path)
        t = time.perf_counter(); cold = await compile_kernel(ctx, backend, cand, use_store=False); cold_s = time.perf_counter() - t
        t = time.perf_counter(); warm = await compile_kernel(ctx, backend, cand, use_store=False); warm_s = time.perf_counter() - t
        t = time.perf_counter(); ver = await verify_against_reference(ctx, backend, ref, cand, use_store=False); ver_s = time.perf_counter() - t
        t = time.perf_counter(); prof = await profile_kernel(ctx, backend, ref, cand, budget_s=1.0); prof_s = time.perf_counter() - t
        medians = []
        for _ in range(noise_runs):
            p = await profile_kernel(ctx, backend, ref, cand, baselines=("eager",), budget_s=1.0)
            medians.append(p.report.candidate.median_us)
        rows.append({
            "candidate": label, "plain_load_inline_s": round(plain, 2),
            "compile_cold_s": round(cold_s, 2), "build_s": cold.build_seconds, "compile_cached_s": round(warm_s, 2),
            "cached_hit": warm.from_cache, "verify_s": round(ver_s, 2), "correct": ver.correct,
            "profile_s": round(prof_s, 2), "candidate_median_us": round(prof.report.candidate.median_us, 3),
            "speedup_eager": prof.report.baselines[0].speedup,
            "speedup_compile": prof.report.baselines[1].speedup if len(prof.report.baselines) > 1 else None,
            "noise_medians_us": [round(m, 3) for m in medians],
            "noise_spread_pct": round(100 * (max(medians) - min(medians)) / statistics.median(medians), 2) if medians else None,
        })
    import torch
    return {"device": avail.device_name, "backend": backend, "date": time.strftime("%Y-%m-%d"),
            "versions": {**avail.versions, "python": platform.python_version(), "torch": torch.__version__}, "rows": rows}


def table(result: dict) -> str:
    cols = ["candidate", "plain_load_inline_s", "compile_cold_s", "compile_cached_s", "verify_s", "profile_s",
            "candidate_median_us", "speedup_eager", "speedup_compile", "noise_spread_pct"]
    lines = [f"# Turnaround on {result['device']} ({result['backend']}), {result['date']}", "",
             "versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in result["rows"]:
        lines.append("| " + " | ".join(str(r.get(c)) for c in cols) + " |")
    lines += ["", "noise: the same kernel profiled in separate calls; medians (us): "
              + "; ".join(f"{r['candidate']}: {r['noise_medians_us']}" for r in result["rows"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--noise-runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:  # an empty data directory: the first build is cold
        result = anyio.run(measure, args.backend, args.noise_runs, Path(home))
    text = table(result)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"turnaround-{args.backend}-{result['date']}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (args.out / f"{stem}.md").write_text(text)


if __name__ == "__main__":
    main()
