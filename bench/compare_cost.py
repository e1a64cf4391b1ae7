"""What the judge's output compare costs (`harness/compare.py`): the pass that takes every value as finite
(`_Pass.finite`, what an output without NaN or Inf gets) against the pass that masks NaN and Inf in every chunk (what
every output got before), on the same outputs in the same process, alternating. The judge compares each trial's
outputs (verify) and each profiled input set's (profile); on level1/63's 5 GB output the masked pass took 0.34 s a
compare on an H200.

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


def _timed(expected: torch.Tensor, got: torch.Tensor, exact: torch.Tensor | None, device: str, finite: bool) -> float:
    compare._FINITE_FIRST = finite  # False: the masked pass alone
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
        compare._FINITE_FIRST = True


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
            _timed(expected, got, exact, args.device, True)  # first use of the kernels
            times = {"masked": [], "finite": []}
            for _ in range(args.repeats):
                for kind in times:
                    times[kind].append(_timed(expected, got, exact, args.device, kind == "finite"))
            masked, finite = statistics.median(times["masked"]), statistics.median(times["finite"])
            rows.append({"mi_elements": size, "float64_truth": with_truth, "masked_s": round(masked, 4),
                         "finite_s": round(finite, 4), "speedup": round(masked / finite, 2), "runs": times})
            del exact
        del expected, got
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or "cpu"
    meta = {"date": datetime.date.today().isoformat(), "device": device, "torch": torch.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads(), "repeats": args.repeats}
    lines = [f"# compare cost on {device} ({args.device}), {meta['date']}", "",
             f"torch {meta['torch']}, Python {meta['python']}, {meta['threads']} threads; median of {args.repeats}, "
             "alternating", "", "| Mi elements (float32) | float64 truth | masked pass s | finite pass s | masked / finite |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['mi_elements']} | {'yes' if r['float64_truth'] else 'no'} | {r['masked_s']} | {r['finite_s']} | "
              f"{r['speedup']} |" for r in rows]
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"compare-cost-{args.device.split(':')[0]}-{meta['date']}"
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
