"""What the judge's output compare costs (`harness/compare.py`), its three passes on the same outputs in the same
process, alternating: the torch pass that masks NaN and Inf in every chunk (what every output got until s39), the torch
pass that takes every value as finite (`_Pass.finite`, from s39 what an output without NaN or Inf got), and on a GPU
the fused Triton kernel (`compare_kernel`, what an output on a GPU gets now). The judge compares each trial's outputs
(verify) and each profiled input set's (profile); on level1/63's 8.6 GB output the masked pass took 0.34 s a compare
on an H200. Every pass must say "correct" (the candidate is the reference plus 1e-6 noise).

    python3 bench/compare_cost.py [--device cuda] [--sizes 16 64] [--repeats 3]   # sizes in Mi elements of float32

Prints a table and writes JSON + Markdown under bench/out/ (or --out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from kforge.tools.harness import compare

HERE = Path(__file__).resolve().parent


_PASSES = {"masked": ("off", False), "finite": ("off", True), "fused": ("gpu", True)}  # -> (_FUSED, _FINITE_FIRST)


def _timed(expected: torch.Tensor, got: torch.Tensor, exact: torch.Tensor | None, device: str, kind: str) -> float:
    compare._FUSED, compare._FINITE_FIRST = _PASSES[kind]
    try:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        [check] = compare.compare_outputs([expected], [got], exact=[exact] if exact is not None else None, device=device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        assert check.correct, check.problems
        return time.perf_counter() - started
    finally:
        compare._FUSED, compare._FINITE_FIRST = _PASSES["fused"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", nargs="+", type=int, default=[16, 64], help="Mi elements of float32 per output")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "out")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for size in args.sizes:
        expected = torch.randn(size * 2**20, device=args.device)
        got = expected + 1e-6 * torch.randn_like(expected)
        for with_truth in (False, True):
            exact = expected.double() if with_truth else None
            kinds = [k for k in _PASSES if k != "fused" or args.device.startswith("cuda")]
            for kind in kinds:
                _timed(expected, got, exact, args.device, kind)  # first use of its kernels
            times: dict[str, list[float]] = {kind: [] for kind in kinds}
            for _ in range(args.repeats):
                for kind in kinds:
                    times[kind].append(_timed(expected, got, exact, args.device, kind))
            median = {kind: statistics.median(t) for kind, t in times.items()}
            rows.append({"mi_elements": size, "float64_truth": with_truth,
                         **{f"{kind}_s": round(m, 4) for kind, m in median.items()},
                         **{f"masked_over_{kind}": round(median["masked"] / m, 2) for kind, m in median.items()
                            if kind != "masked"}, "runs": times})
            del exact
        del expected, got
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or "cpu"
    meta = {"date": datetime.date.today().isoformat(), "device": device, "torch": torch.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads(), "repeats": args.repeats}
    lines = [f"# compare cost on {device} ({args.device}), {meta['date']}", "",
             f"torch {meta['torch']}, Python {meta['python']}, {meta['threads']} threads; median of {args.repeats}, "
             "alternating", "", "| Mi elements (float32) | float64 truth | masked pass s | finite pass s | fused kernel s | "
             "masked / finite | masked / fused |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mi_elements']} | {'yes' if r['float64_truth'] else 'no'} | {r['masked_s']} | {r['finite_s']} | "
              f"{r.get('fused_s', '-')} | {r['masked_over_finite']} | {r.get('masked_over_fused', '-')} |" for r in rows]
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"compare-cost-{args.device.split(':')[0]}-{meta['date']}"
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
