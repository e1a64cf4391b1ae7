"""A new user's check: candidates KForge has never seen, driven through a real MCP client, with the
timing compared against Nsight Compute's own kernel durations.

For each case directory (a `reference.py` and a `candidate.py` in KernelBench form; the backend is
the directory name's prefix, `cuda_` or `triton_`):
  1. start `kforge serve` over stdio and call compile_kernel, verify_against_reference and
     profile_kernel as any MCP client would (structured results),
  2. run the candidate alone under `ncu --clock-control none --cache-control all` (boost clocks like
     the timed calls, caches flushed like KForge's flush) and sum `gpu__time_duration` of the
     candidate's kernels per forward call,
  3. print and write a table: KForge's median per call beside ncu's per call, and their ratio.

Event timing includes launch gaps between a call's kernels and ncu's duration does not, so KForge's
figure should sit at or a little above ncu's for a single-kernel call; far below would mean the timer
missed work.

Usage (GPU host): python3 bench/new_user_check.py --out DIR CASE_DIR [CASE_DIR ...]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import anyio

_NCU_CALLS = 5  # forward calls profiled by ncu after two warm-up calls


def _server_params(home: Path):
    from mcp import StdioServerParameters

    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH", "CXX", "CC", "CUDA_HOME")}
    env["KFORGE_HOME"] = str(home)
    return StdioServerParameters(command=sys.executable, args=["-m", "kforge.server.cli", "serve"], env=env)


def _data(result) -> dict:
    if result.is_error:
        raise RuntimeError(result.content[0].text)
    return result.structured_content


async def through_mcp(case: Path, backend: str, home: Path) -> dict:
    from mcp import Client, stdio_client

    ref, cand = (case / "reference.py").read_text(), (case / "candidate.py").read_text()
    row: dict = {}
    with open(home / "server-stderr.log", "a") as errlog:
        async with Client(stdio_client(_server_params(home), errlog=errlog)) as client:
            t = time.perf_counter()
            built = _data(await client.call_tool("compile_kernel", {"backend": backend, "candidate_code": cand}))
            row["compile_s"], row["compile_ok"] = round(time.perf_counter() - t, 2), built["ok"]
            t = time.perf_counter()
            verdict = _data(await client.call_tool("verify_against_reference", {
                "backend": backend, "reference_code": ref, "candidate_code": cand}))
            row["verify_s"], row["correct"] = round(time.perf_counter() - t, 2), verdict["correct"]
            row["failed_checks"] = [c["name"] for c in verdict.get("checks", []) if c["status"] == "fail"]
            t = time.perf_counter()
            prof = _data(await client.call_tool("profile_kernel", {
                "backend": backend, "reference_code": ref, "candidate_code": cand, "budget_s": 1.0}))
            row["profile_s"] = round(time.perf_counter() - t, 2)
            report = prof.get("report") or {}
            cand_t = report.get("candidate") or {}
            row["kforge_median_us"] = cand_t.get("median_us")
            row["kforge_iqr_pct"] = (round(100 * (cand_t["q3_us"] - cand_t["q1_us"]) / cand_t["median_us"], 2)
                                     if cand_t else None)
            row["samples"] = cand_t.get("samples")
            row["speedup_trusted"] = prof.get("speedup_trusted")
            row["speedup_eager"] = next((b["speedup"] for b in report.get("baselines", []) if b["name"] == "eager"), None)
            row["kforge_ncu_us"] = [k["metrics"].get("Duration [us]") for k in report.get("ncu", []) if k.get("is_custom")]
            row["custom_kernels"] = sorted({op["name"] for op in report.get("ops", []) if op.get("is_custom")})
    return row


def ncu_per_call_us(case: Path, backend: str, out: Path) -> tuple[float | None, str]:
    """Sum of ncu's gpu__time_duration over the candidate's kernels, per forward call (median over calls)."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return None, "ncu not on PATH"
    script = textwrap.dedent(f"""
        import runpy, torch
        ref = runpy.run_path({str(case / 'reference.py')!r})
        mod = runpy.run_path({str(case / 'candidate.py')!r})
        torch.manual_seed(0)
        inputs = ref["get_inputs"]()
        model = mod["ModelNew"](*ref["get_init_inputs"]()).cuda()
        with torch.no_grad():
            for _ in range(2):
                model(*inputs)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("kforge_check")
            for i in range({_NCU_CALLS}):
                torch.cuda.nvtx.range_push(f"call{{i}}")
                model(*inputs)
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
            torch.cuda.nvtx.range_pop()
    """)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.py"
        path.write_text(script)
        cmd = [ncu, "--clock-control", "none", "--cache-control", "all", "--nvtx", "--nvtx-include", "kforge_check/",
               "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base", sys.executable, str(path)]
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(Path(tmp) / "ext"), "TRITON_CACHE_DIR": str(Path(tmp) / "triton")}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    (out / f"ncu-{case.name}.csv").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr[-4000:])
    rows = [r for r in csv.DictReader(io.StringIO(_csv_part(proc.stdout))) if r.get("Metric Name") == "gpu__time_duration.sum"]
    if not rows:
        return None, f"ncu gave no durations (exit {proc.returncode})"
    # Kernels of one call are consecutive launches; the framework's own (e.g. empty allocations) are
    # not kernels. All profiled kernels belong to the candidate's forward.
    per_call = len(rows) // _NCU_CALLS or 1
    durations_ns = [float(r["Metric Value"].replace(",", "")) for r in rows]
    calls = [sum(durations_ns[i:i + per_call]) / 1e3 for i in range(0, per_call * _NCU_CALLS, per_call)]
    names = sorted({r["Kernel Name"].split("(")[0] for r in rows})
    return statistics.median(calls), f"{per_call} kernel(s) per call: {', '.join(names)}"


def _csv_part(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), len(lines))
    return "\n".join(lines[start:])


def _meta() -> dict:
    import torch

    ncu = shutil.which("ncu")
    return {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "ncu": subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
            if ncu else None}


def write_results(meta: dict, rows: list[dict], out: Path) -> str:
    """Write JSON and a Markdown table (after every case, so a run cut short keeps what it measured)."""
    (out / "new-user-check.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [f"# New-user check, {meta['date']}, {meta['device']}", "",
             f"torch {meta['torch']}, CUDA {meta['cuda']}, Python {meta['python']}, ncu {meta['ncu']}", "",
             "| case | compile s | verify s | profile s | correct | KForge median us (IQR %) | ncu per call us | ratio | eager speedup |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r.get('compile_s')} | {r.get('verify_s')} | {r.get('profile_s')} | {r.get('correct')} "
                     f"| {r.get('kforge_median_us')} ({r.get('kforge_iqr_pct')}) | {r.get('ncu_per_call_us')} "
                     f"| {r.get('kforge_over_ncu')} | {r.get('speedup_eager')} |")
    text = "\n".join(lines) + "\n"
    (out / "new-user-check.md").write_text(text)
    return text


async def main_async(cases: list[Path], out: Path) -> None:
    meta, rows = _meta(), []
    with tempfile.TemporaryDirectory() as home:
        for case in cases:
            backend = case.name.split("_", 1)[0]
            print(f"[{case.name}] through MCP ({backend})", file=sys.stderr, flush=True)
            try:
                row = await through_mcp(case, backend, Path(home))
            except Exception as exc:  # noqa: BLE001 - report and go on to the next case
                row = {"error": str(exc)[-800:]}
            print(f"[{case.name}] ncu", file=sys.stderr, flush=True)
            ncu_us, ncu_note = ncu_per_call_us(case, backend, out)
            row.update(case=case.name, backend=backend, ncu_per_call_us=ncu_us, ncu_note=ncu_note)
            med = row.get("kforge_median_us")
            row["kforge_over_ncu"] = round(med / ncu_us, 3) if med and ncu_us else None
            rows.append(row)
            print(json.dumps(row), flush=True)
            table = write_results(meta, rows, out)
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    anyio.run(main_async, [c.resolve() for c in args.cases], args.out)


if __name__ == "__main__":
    main()
