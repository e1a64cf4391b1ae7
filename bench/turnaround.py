"""Turnaround and timing-noise benchmark: prints a table and writes JSON + Markdown results.

Per candidate, in one run and on one machine:
  * the field's baseline in a fresh Python process (what KernelBench pays): for cuda/cpu, importing the
    candidate with stock `load_inline` and a cold TORCH_EXTENSIONS_DIR; for triton, importing it and
    running one forward on the reference's inputs (Triton compiles at first launch) with a cold
    TRITON_CACHE_DIR,
  * KForge compile_kernel cold (empty build cache) and again from the build cache,
  * verify_against_reference and profile_kernel wall time;
then the same kernel profiled N times in separate calls (median and spread of the medians).

Candidates: the backend's served example (elementwise ReLU) and `bench/candidates/` (a reduction, a
matmul and a fused level-2 GEMM + bias + GELU), one set per backend in SETS.

Usage: python bench/turnaround.py --backend {cuda,triton,cpu} [--only LABEL ...] [--out DIR] [--noise-runs 5]
       python bench/turnaround.py --merge A.json B.json ... [--out DIR]   (one table from partial runs)

A full run takes minutes per candidate (on an H200: about 1.5 min per Triton row with --noise-runs 2, more
for a cold CUDA build); where one command may run only 10 minutes, split it with --only and --merge.
"""

from __future__ import annotations

import argparse
import json
import os
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
EXAMPLES = HERE.parent / "resources" / "examples"
CANDIDATES = HERE / "candidates"

# backend -> rows of (label, problem, candidate file); problem None: the example's own reference.
SETS: dict[str, list[tuple[str, str | None, Path]]] = {
    "cuda": [
        ("elementwise relu", "relu", EXAMPLES / "cuda" / "candidate.py"),
        ("reduction softmax", "softmax", CANDIDATES / "cuda_softmax.py"),
        ("matmul", "matmul", CANDIDATES / "cuda_matmul.py"),
        ("fused gemm+bias+gelu", "gemm_bias_gelu", CANDIDATES / "cuda_gemm_bias_gelu.py"),
    ],
    "triton": [
        ("elementwise relu", "relu", EXAMPLES / "triton" / "candidate.py"),
        ("reduction softmax", "softmax", CANDIDATES / "triton_softmax.py"),
        ("matmul", "matmul", CANDIDATES / "triton_matmul.py"),
        ("fused gemm+bias+gelu", "gemm_bias_gelu", CANDIDATES / "triton_gemm_bias_gelu.py"),
    ],
    "cpu": [("fused elementwise", None, EXAMPLES / "cpu" / "candidate.py")],
}

PLAIN_METHOD = {
    "cuda": "fresh interpreter: import torch, import the candidate with stock load_inline, cold TORCH_EXTENSIONS_DIR",
    "cpu": "fresh interpreter: import torch, import the candidate with stock load_inline, cold TORCH_EXTENSIONS_DIR",
    "triton": "fresh interpreter: import torch, import the candidate, one forward on the reference's inputs "
              "(first-launch JIT) and a device sync; TRITON_CACHE_DIR a temporary directory, cold for this "
              "candidate's kernels (shared by the rows of one run, like KForge's data directory)",
}

# The field's figure this benchmark is read beside (KernelBench's own harness, H200 host, cold).
FIELD = {
    "cuda": "KernelBench harness: about 30 s per CUDA candidate cold (29-31 s for six small candidates), nearly all in load_inline",
    "triton": "KernelBench harness: about 1.2 s per Triton candidate",
}

_TIMEOUT_S = 900


def _run_fresh(code: str, env: dict[str, str]) -> tuple[float, float]:
    """Run `code` in a fresh interpreter; (wall seconds of the process, seconds it printed last)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=_TIMEOUT_S,
                         env={**os.environ, **env})
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return wall, float(out.stdout.strip().splitlines()[-1])


def plain_load_inline_s(candidate: Path) -> tuple[float, float]:
    """(process wall s, s after `import torch`) to import the candidate with stock load_inline (cold build dir)."""
    with tempfile.TemporaryDirectory() as tmp:
        code = textwrap.dedent(f"""
            import time, runpy
            import torch
            t = time.perf_counter(); runpy.run_path({str(candidate)!r}); print(time.perf_counter() - t)
        """)
        return _run_fresh(code, {"TORCH_EXTENSIONS_DIR": tmp})


def plain_triton_first_call_s(candidate: Path, reference: str, cache_dir: Path) -> tuple[float, float]:
    """(process wall s, s after `import torch`) to import a Triton candidate and run its first forward.

    The candidate's kernels JIT-compile at that first launch; `cache_dir` (TRITON_CACHE_DIR) holds none of
    them. Without a GPU this runs under Triton's interpreter on CPU tensors (no compile: a smoke test).
    """
    with tempfile.TemporaryDirectory() as tmp:
        ref_path = Path(tmp) / "reference.py"
        ref_path.write_text(reference)
        code = textwrap.dedent(f"""
            import os, time, runpy
            import torch
            gpu = torch.cuda.is_available()
            if not gpu:
                os.environ["TRITON_INTERPRET"] = "1"
            dev = "cuda" if gpu else "cpu"
            t = time.perf_counter()
            ref = runpy.run_path({str(ref_path)!r})
            torch.manual_seed(0)
            inputs = [x.to(dev) if hasattr(x, "to") else x for x in ref["get_inputs"]()]
            init = ref["get_init_inputs"]()
            mod = runpy.run_path({str(candidate)!r})
            model = mod["ModelNew"](*init).to(dev)
            with torch.no_grad():
                model(*inputs)
            if gpu:
                torch.cuda.synchronize()
            print(time.perf_counter() - t)
        """)
        return _run_fresh(code, {"TRITON_CACHE_DIR": str(cache_dir)})


def _speedup(prof, name: str) -> float | None:
    if prof is None or prof.report is None:
        return None
    return next((b.speedup for b in prof.report.baselines if b.name == name), None)


def _median_us(prof) -> float | None:
    if prof is None or prof.report is None or prof.report.candidate is None:
        return None
    return prof.report.candidate.median_us


def _rounded(x: float | None, nd: int) -> float | None:
    return None if x is None else round(x, nd)


async def measure(backend: str, rows_wanted: list[tuple[str, str | None, Path]], noise_runs: int, home: Path,
                  plain_cache: Path) -> dict:
    from kforge.server.catalog import example, problem_reference
    from kforge.tools.context import ToolContext
    from kforge.tools.evaluate import compile_kernel, verify_against_reference
    from kforge.tools.profile import profile_kernel
    from kforge.tools.requests import CompileRequest, ProfileRequest, VerifyRequest

    ctx = ToolContext(home=home)
    avail = await ctx.require_backend(backend)
    rows = []
    for label, problem, cand_path in rows_wanted:
        ref = problem_reference(problem) if problem else example(backend)["reference"]
        cand = cand_path.read_text()
        print(f"[{backend}] {label}: {cand_path.relative_to(HERE.parent)}", file=sys.stderr, flush=True)
        row_t0 = time.perf_counter()
        try:
            if backend == "triton":
                plain, plain_inner = plain_triton_first_call_s(cand_path, ref, plain_cache)
            else:
                plain, plain_inner = plain_load_inline_s(cand_path)
            plain_error = None
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            plain = plain_inner = None
            plain_error = str(exc)[-500:]
        t = time.perf_counter(); cold = await compile_kernel(ctx, CompileRequest(backend=backend, candidate_code=cand,
                use_store=False)); cold_s = time.perf_counter() - t
        t = time.perf_counter(); warm = await compile_kernel(ctx, CompileRequest(backend=backend, candidate_code=cand,
                use_store=False)); warm_s = time.perf_counter() - t
        t = time.perf_counter(); ver = await verify_against_reference(ctx, VerifyRequest(backend=backend,
                reference_code=ref, candidate_code=cand, use_store=False)); ver_s = time.perf_counter() - t
        prof, prof_s, medians, prof_error = None, None, [], None
        if not avail.timing:
            prof_error = f"not timed: {avail.reason}"
        elif not ver.correct:
            prof_error = "not timed: the candidate failed verification"
        else:
            t = time.perf_counter(); prof = await profile_kernel(ctx, ProfileRequest(backend=backend,
                    reference_code=ref, candidate_code=cand, budget_s=1.0)); prof_s = time.perf_counter() - t
            if prof.failure is not None:
                prof_error = str(prof.failure)
            for _ in range(noise_runs):
                p = await profile_kernel(ctx, ProfileRequest(backend=backend, reference_code=ref, candidate_code=cand,
                                                             baselines=("eager",), budget_s=1.0,
                                                             hardware_counters=False))
                if (m := _median_us(p)) is not None:
                    medians.append(m)
        noise_median = statistics.median(medians) if medians else None
        rows.append({
            "candidate": label, "problem": problem, "file": str(cand_path.relative_to(HERE.parent)),
            "plain_s": _rounded(plain, 2), "plain_inner_s": _rounded(plain_inner, 2), "plain_error": plain_error,
            "compile_cold_s": round(cold_s, 2), "build_s": cold.build_seconds, "compile_ok": cold.ok,
            "compile_cached_s": round(warm_s, 2), "cached_hit": warm.from_cache,
            "verify_s": round(ver_s, 2), "correct": ver.correct, "verify_failure": str(ver.failure) if ver.failure else None,
            "profile_s": _rounded(prof_s, 2), "profile_error": prof_error,
            "candidate_median_us": _rounded(_median_us(prof), 3),
            "speedup_eager": _speedup(prof, "eager"), "speedup_compile": _speedup(prof, "torch.compile"),
            "noise_medians_us": [round(m, 3) for m in medians],
            "noise_median_us": _rounded(noise_median, 3),
            "noise_spread_pct": round(100 * (max(medians) - min(medians)) / noise_median, 2) if medians else None,
        })
        print(f"[{backend}] {label}: done in {time.perf_counter() - row_t0:.0f} s", file=sys.stderr, flush=True)
    import torch
    return {"device": avail.device_name, "backend": backend, "mode": avail.mode, "date": time.strftime("%Y-%m-%d"),
            "plain_method": PLAIN_METHOD.get(backend), "field": FIELD.get(backend),
            "versions": {**avail.versions, "python": platform.python_version(), "torch": torch.__version__}, "rows": rows}


def _footnotes(result: dict) -> list[str]:
    backend, rows = result["backend"], result["rows"]
    notes = [f"plain_s: {result.get('plain_method')}. Wall time of the whole process (interpreter start and "
             "`import torch` included, as KForge's worker pays them too); plain_inner_s: the same after `import torch`.",
             "compile_cold_s / compile_cached_s / verify_s / profile_s: wall time of one KForge tool call each, from a "
             "fresh temporary data directory (KFORGE_HOME): its build cache (TORCH_EXTENSIONS_DIR) and Triton cache "
             "(TRITON_CACHE_DIR) both live under it, so the first compile is cold. Each call starts its own worker "
             "processes; verify also runs the reference, 5 trials and the comparison."]
    if backend == "triton":
        notes.append("triton: compile_kernel only imports the module; Triton compiles a kernel at its first launch, "
                     "so compile_cold_s holds no kernel compilation and verify_s holds the cold first-launch JIT "
                     "(KForge's Triton cache is empty until verify). Compare plain_s with compile_cold_s + verify_s. "
                     "The first row of a run also pays Triton's one-time build of its driver helpers, on both sides.")
    if result.get("mode"):
        notes.append(f"mode: {result['mode']}: nothing was compiled for a device and nothing timed.")
    if result.get("field"):
        ours = [r["compile_cold_s"] + (r["verify_s"] if backend == "triton" else 0) for r in rows]
        what = "compile_cold_s + verify_s" if backend == "triton" else "compile_cold_s"
        if ours:
            notes.append(f"field: {result['field']}. Ours ({what}): median {statistics.median(ours):.2f} s, "
                         f"range {min(ours):.2f}-{max(ours):.2f} s over {len(ours)} candidate(s); the plain path in this run, "
                         "plain_s (plain_inner_s): "
                         + ", ".join(f"{r.get('plain_s')} ({r.get('plain_inner_s')})" for r in rows) + " s.")
    notes.append("noise: the same kernel profiled in separate calls (eager baseline only); medians (us): "
                 + "; ".join(f"{r['candidate']}: {r.get('noise_medians_us')}" for r in rows)
                 + ". noise_spread_pct = (max - min) / median of those medians.")
    failures = []
    for r in rows:
        why = [r.get("plain_error") and f"plain: {r['plain_error']}",
               not r["correct"] and f"verify: {r.get('verify_failure') or 'wrong output'}",
               r["correct"] and not result.get("mode") and r.get("profile_error")]
        if any(why):
            failures.append(f"{r['candidate']}: " + "; ".join(w for w in why if w))
    if failures:
        notes.append("failures: " + "; ".join(failures))
    return notes


def table(result: dict) -> str:
    cols = ["candidate", "plain_s", "plain_inner_s", "compile_cold_s", "compile_cached_s", "verify_s", "correct", "profile_s",
            "candidate_median_us", "speedup_eager", "speedup_compile", "noise_median_us", "noise_spread_pct"]
    lines = [f"# Turnaround on {result['device']} ({result['backend']}), {result['date']}", "",
             "versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in result["rows"]:
        lines.append("| " + " | ".join(str(r.get(c)) for c in cols) + " |")
    lines += [""] + [f"- {n}" for n in _footnotes(result)]
    return "\n".join(lines) + "\n"


def select(backend: str, only: list[str] | None) -> list[tuple[str, str | None, Path]]:
    rows = SETS[backend]
    if not only:
        return rows
    wanted = [o.lower() for o in only]
    picked = [r for r in rows if any(w in r[0].lower() or w == (r[1] or "") for w in wanted)]
    if not picked:
        raise SystemExit(f"--only {only} matches no row of {backend}: " + ", ".join(repr(r[0]) for r in rows))
    return picked


def merge(paths: list[Path]) -> dict:
    """One result from several partial runs of one backend, rows in SETS order."""
    parts = [json.loads(p.read_text()) for p in paths]
    backends = {p["backend"] for p in parts}
    if len(backends) != 1:
        raise SystemExit(f"--merge: the files are of different backends: {sorted(backends)}")
    devices = {p["device"] for p in parts}
    if len(devices) != 1:
        raise SystemExit(f"--merge: the files were measured on different devices: {sorted(devices)}")
    order = {label: i for i, (label, _, _) in enumerate(SETS[parts[0]["backend"]])}
    rows = {r["candidate"]: r for p in parts for r in p["rows"]}  # a later file's row replaces an earlier one
    return {**parts[0], "date": max(p["date"] for p in parts),
            "rows": sorted(rows.values(), key=lambda r: order.get(r["candidate"], len(order)))}


def write(result: dict, out: Path, stem: str) -> None:
    text = table(result)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="rows per backend:\n" + "\n".join(
                                         f"  {b}: " + ", ".join(r[0] for r in rows) for b, rows in SETS.items()))
    parser.add_argument("--backend", default="cuda", choices=sorted(SETS))
    parser.add_argument("--only", action="append", metavar="LABEL",
                        help="run only rows whose label contains LABEL (or whose problem is LABEL); repeatable")
    parser.add_argument("--noise-runs", type=int, default=5)
    parser.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                        help="measure nothing: combine the JSON results of partial runs into one table")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    if args.merge:
        result = merge(args.merge)
        write(result, args.out, f"turnaround-{result['backend']}-{result['date']}")
        return
    rows = select(args.backend, args.only)
    # Empty data directory and Triton cache: the first build is cold, on KForge's side and the plain side.
    with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as plain_cache:
        result = anyio.run(measure, args.backend, rows, args.noise_runs, Path(home), Path(plain_cache))
    stem = f"turnaround-{args.backend}-{result['date']}"
    if args.only:  # a partial run does not overwrite the full one
        stem += "-only-" + "-".join("".join(c if c.isalnum() else "_" for c in o) for o in args.only)
    write(result, args.out, stem)


if __name__ == "__main__":
    main()
