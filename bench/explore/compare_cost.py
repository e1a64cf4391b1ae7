"""What does comparing a large output cost, and what could it? (issue 16: on KernelBench's level1/63 at its published
size, each compare of its 5 GB float32 output took 0.34 s on an H200, ~10 of them a verify and 5 a profile.)

The judge's compare (`kforge.tools.harness.compare`) streams the output in float64 chunks through ~45 torch kernels
each. Against it, on the same tensors, a one-pass Triton kernel that reads each pair of elements once and computes
the same quantities (mismatches under atol/rtol, NaN and Inf rules, max abs and rel error, the sums of the relative
L2 error) in float64 registers, one partial per block summed after. Printed as a table and as JSON; the quantities
of both must agree. Run on a GPU host with the checkout importable as `kforge` (as scripts/run_gpu_tests.sh
arranges): python3 bench/explore/compare_cost.py [--gb 5]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl

_FLT_MAX = 3.4028234663852886e38  # a float32 above it is an infinity (a float argument of a kernel is a float32)


@triton.jit
def _one_pass(e_ptr, g_ptr, out_ptr, n, atol, rtol, big_floor, flt_max, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    e32 = tl.load(e_ptr + offs, mask=m, other=0.0)
    g32 = tl.load(g_ptr + offs, mask=m, other=0.0)
    e_inf, g_inf = tl.abs(e32) > flt_max, tl.abs(g32) > flt_max
    e, g = e32.to(tl.float64), g32.to(tl.float64)
    diff = tl.abs(g - e)
    e_abs = tl.abs(e)
    e_nan, g_nan = e != e, g != g
    ok = (diff <= atol + rtol * e_abs) | (e_nan & g_nan) | (e_inf & (g == e))
    finite = m & ~e_nan & ~g_nan & ~e_inf & ~g_inf
    abs_err = tl.where(finite, diff, 0.0)
    big = finite & (e_abs > big_floor)
    rel = tl.where(big, diff / tl.where(big, e_abs, 1.0), 0.0)
    t = tl.where(finite, e, 0.0)
    base = out_ptr + pid.to(tl.int64) * 8
    tl.store(base + 0, tl.sum(tl.where(m & ~ok, 1.0, 0.0).to(tl.float64), axis=0))
    tl.store(base + 1, tl.max(abs_err, axis=0))
    tl.store(base + 2, tl.max(rel, axis=0))
    tl.store(base + 3, tl.sum(tl.where(m & g_nan & ~e_nan, 1.0, 0.0).to(tl.float64), axis=0))
    tl.store(base + 4, tl.sum(tl.where(m & g_inf & ~e_inf, 1.0, 0.0).to(tl.float64), axis=0))
    tl.store(base + 5, tl.sum(abs_err * abs_err, axis=0))
    tl.store(base + 6, tl.sum(t * t, axis=0))


def one_pass(e, g, atol: float, rtol: float) -> dict:
    n, block = e.numel(), 4096
    blocks = triton.cdiv(n, block)
    out = torch.zeros(blocks, 8, dtype=torch.float64, device=e.device)
    _one_pass[(blocks,)](e, g, out, n, atol, rtol, max(atol, 1e-12), _FLT_MAX, BLOCK=block)
    total, peak = out.sum(0).tolist(), out.amax(0).tolist()
    return {"mismatches": int(total[0]), "max_abs": peak[1], "max_rel": peak[2], "nan": int(total[3]),
            "inf": int(total[4]), "rel_error": (total[5] / total[6]) ** 0.5}


def judge_compare(e, g) -> dict:
    from kforge.tools.harness.compare import compare_outputs

    [c] = compare_outputs([e], [g], device=str(e.device))
    return {"mismatches": c.mismatches, "max_abs": c.max_abs_error, "max_rel": c.max_rel_error, "nan": c.nan_count,
            "inf": c.inf_count, "rel_error": c.rel_error}


def timed(fn, reps: int = 3) -> tuple[float, dict]:
    fn()  # compiles, allocates
    torch.cuda.synchronize()
    best, out = float("inf"), {}
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=5.0, help="the output's size in GB (float32)")
    args = ap.parse_args()
    n = int(args.gb * 1e9 / 4)
    gen = torch.Generator(device="cuda").manual_seed(0)
    e = torch.randn(n, device="cuda", generator=gen)
    g = e + 1e-6 * torch.randn(n, device="cuda", generator=gen)
    g[::100_003] += 1.0  # some mismatches
    g[7] = float("nan")
    g[11] = float("inf")
    rows = {}
    for name, fn in (("judge's compare (float64 chunks)", lambda: judge_compare(e, g)),
                     ("one Triton pass", lambda: one_pass(e, g, 1e-4, 1e-4))):
        try:
            s, out = timed(fn)
            rows[name] = {"s": round(s, 4), **out}
        except Exception as exc:  # noqa: BLE001 - a prototype: say why it failed
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}; "
          f"output {args.gb} GB float32 ({n} elements)")
    print("| compare | s | mismatches | max abs | max rel | NaN | Inf | rel L2 error |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | {r['error']} |")
        else:
            print(f"| {name} | {r['s']} | {r['mismatches']} | {r['max_abs']:.4g} | {r['max_rel']:.4g} | {r['nan']} | "
                  f"{r['inf']} | {r['rel_error']:.6g} |")
    print(json.dumps({"gb": args.gb, "device": torch.cuda.get_device_name(0), "rows": rows}))


if __name__ == "__main__":
    main()
