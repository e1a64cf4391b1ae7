"""Capture real profiler output of kernels whose bottleneck is known, as test data for the analyst.

For each case in `tests/data/known_bottlenecks/<case>/` (a reference and a CUDA candidate written to
have one clear bottleneck), run KForge's `profile_kernel` with Nsight Compute on the GPU and write to
`--out/<case>/`:
  * `report.json`       the normalized `ProfileReport` (what `summarize_profile(profile_id=...)` reads),
  * `profile.txt`       the tool's text answer,
  * `torch_table.txt`   torch.profiler's `key_averages().table()` of the profiled calls,
  * `ncu_details.txt`   `ncu --import profile.ncu-rep --page details` (what a user pastes),
  * `ncu_details.csv`   the same page with `--csv`,
  * `ncu_metrics.txt`   every metric of the hottest profiled launch (to see what the report offers).

Usage (GPU host): python3 bench/capture_profiles.py --out DIR [CASE ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
CASES = HERE.parent / "tests" / "data" / "known_bottlenecks"


def _ncu_pages(rep: Path, dest: Path) -> None:
    ncu = shutil.which("ncu")
    if ncu is None:
        return
    for name, extra in (("ncu_details.txt", []), ("ncu_details.csv", ["--csv"])):
        out = subprocess.run([ncu, "--import", str(rep), "--page", "details", *extra], capture_output=True, text=True)
        (dest / name).write_text(out.stdout if out.returncode == 0 else out.stderr)


def _metric_dump(rep: Path, dest: Path) -> None:
    from kforge.profilers.ncu import _report_module

    ncu_report = _report_module()
    ctx = ncu_report.load_report(str(rep))
    lines = []
    rng = ctx.range_by_idx(0)
    action = max((rng.action_by_idx(a) for a in range(rng.num_actions())),
                 key=lambda a: a.metric_by_name("gpu__time_duration.sum").as_double())
    lines.append(f"# {action.name()}")
    for name in sorted(action.metric_names()):
        m = action.metric_by_name(name)
        try:
            value = m.as_double() if m.metric_type() != ncu_report.IMetric.MetricType_STRING else m.as_string()
        except Exception as exc:  # noqa: BLE001 - a dump: keep going past odd metric kinds
            value = f"<{exc.__class__.__name__}>"
        lines.append(f"{name}\t{value}\t{m.unit()}")
    (dest / "ncu_metrics.txt").write_text("\n".join(lines) + "\n")


async def capture(cases: list[str], out: Path) -> None:
    from kforge.tools.context import ToolContext
    from kforge.tools.profile import profile_kernel
    from kforge.tools.requests import ProfileRequest

    from kforge.tools.evaluate import compile_kernel

    with tempfile.TemporaryDirectory() as home:
        ctx = ToolContext(home=Path(home))
        t = time.perf_counter()
        async with anyio.create_task_group() as tg:  # cold builds in parallel on the host's cores
            for case in cases:
                tg.start_soon(compile_kernel, ctx, "cuda", (CASES / case / "candidate.py").read_text())
        print(f"built {len(cases)} candidates in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
        for case in cases:
            src = CASES / case
            dest = out / case
            dest.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            prof = await profile_kernel(ctx, ProfileRequest(backend="cuda",
                                                            reference_code=(src / "reference.py").read_text(),
                                                            candidate_code=(src / "candidate.py").read_text(),
                                                            budget_s=1.0))
            print(f"[{case}] profiled in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
            (dest / "profile.txt").write_text(str(prof) + "\n")
            if prof.report is not None:
                (dest / "report.json").write_text(prof.report.model_dump_json(indent=1) + "\n")
            artifacts = ctx.store.artifact_dir(prof.profile_id) if prof.profile_id else None
            if artifacts is not None and (artifacts / "torch_table.txt").exists():
                shutil.copy(artifacts / "torch_table.txt", dest / "torch_table.txt")
            if artifacts is not None and (rep := artifacts / "profile.ncu-rep").exists():
                _ncu_pages(rep, dest)
                try:
                    _metric_dump(rep, dest)
                except Exception as exc:  # noqa: BLE001 - the dump is a convenience, not the capture
                    (dest / "ncu_metrics.txt").write_text(f"metric dump failed: {exc!r}\n")
            summary = {"case": case, "profile_id": prof.profile_id, "failure": str(prof.failure) if prof.failure else None,
                       "median_us": prof.report.candidate.median_us if prof.report and prof.report.candidate else None}
            print(json.dumps(summary), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "captures")
    args = parser.parse_args()
    cases = args.cases or sorted(p.name for p in CASES.iterdir() if (p / "candidate.py").exists())
    anyio.run(capture, cases, args.out)


if __name__ == "__main__":
    main()
