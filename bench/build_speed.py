"""Build speed and candidate turnaround, side by side with plain `load_inline` measured in the same run.

Rows (one run, one machine, one KForge data directory that starts empty, warm workers on):
  * plain load_inline: a fresh interpreter imports the candidate with stock `load_inline` and a cold
    TORCH_EXTENSIONS_DIR (what KernelBench pays per new candidate); `build` excludes `import torch`;
  * KForge compile_kernel of a *new* candidate (sources never built before) in each form:
    cpu: the KernelBench form, then again once the background precompiled header for its flags is ready;
    cuda: the KernelBench form (lean header), and the taught NVRTC form;
    triton: the served example (the plain row imports it and runs its first forward, JIT included);
  * a repeated candidate (cache hit) through compile_kernel;
  * turnaround: compile_kernel + verify_against_reference + profile_kernel(baselines=eager, no ncu) of a
    new candidate (cold) and of the same one again (warm), per stage;
  * throughput: N new candidates (distinct sources) through compile + verify + profile, `--parallel` at
    once, candidates per minute.

Usage: python bench/build_speed.py --backend {cpu,cuda,triton} [--out bench/results] [--throughput N [--mix triton]] [--skip-plain]
Writes build-speed-<backend>-<device>-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from turnaround import plain_load_inline_s, plain_triton_first_call_s  # noqa: E402  (same methods as turnaround.py)

EXAMPLES = HERE.parent / "resources" / "examples"

FORMS = {
    "cpu": {"kernelbench": EXAMPLES / "cpu" / "candidate.py"},
    "cuda": {"kernelbench": EXAMPLES / "cuda" / "candidate_load_inline.py", "nvrtc": EXAMPLES / "cuda" / "candidate.py"},
    "triton": {"triton": EXAMPLES / "triton" / "candidate.py"},
}
# A line inside each form's kernel source that can carry a variant marker (a new source, a new build).
MARK = {"kernelbench": ("#include <torch/extension.h>", "#include <torch/extension.h>\n// variant {i}"),
        "nvrtc": ('extern "C"', '// variant {i}\nextern "C"'),
        # inside the @triton.jit body: Triton's cache key hashes the function's source, comments included
        "triton": ("    mask = offs < n\n", "    mask = offs < n  # variant {i}\n")}


def variant(form: str, text: str, i: int) -> str:
    old, new = MARK[form]
    assert old in text, (form, old)
    return text.replace(old, new.format(i=i), 1)


def not_split(result) -> dict:
    """Why a CUDA build was not split, when it was not (a fast path that silently did not apply is a finding)."""
    why = sorted({b.not_split for b in result.builds if b.not_split})
    return {"not_split": why} if why else {}


async def timed(coro):
    t = time.perf_counter()
    out = await coro
    return out, round(time.perf_counter() - t, 3)


async def main(args) -> dict:
    from kforge.tools.context import ToolContext
    from kforge.tools.evaluate import compile_kernel, verify_against_reference
    from kforge.tools.profile import profile_kernel
    from kforge.tools.requests import CompileRequest, ProfileRequest, VerifyRequest
    from kforge.tools.process.limits import WorkerLimits
    from kforge.server.catalog import example

    backend = args.backend
    reference = example(backend)["reference"]
    home = Path(tempfile.mkdtemp(prefix="kforge-bench-"))
    ctx = ToolContext(home=home, limits=WorkerLimits(precompiled_headers=True))
    rows: list[dict] = []
    avail = {a.backend: a for a in await ctx.availability()}[backend]
    out = {"backend": backend, "device": avail.device_name, "date": date.today().isoformat(),
           "host": platform.node(), "versions": avail.versions, "rows": rows}

    def row(what: str, seconds: float | None, **extra) -> None:
        rows.append({"what": what, "seconds": seconds, **extra})
        print(f"{what:<60} {seconds if seconds is not None else '-':>8}  {json.dumps(extra) if extra else ''}", flush=True)
        write(out, args.out)  # after every row: a run cut off by a time limit keeps what it measured

    forms = FORMS[backend]
    if args.skip_plain:
        pass
    elif backend == "triton":  # the field's cost: import the candidate and JIT its kernels at the first launch
        wall, build = plain_triton_first_call_s(forms["triton"], reference, home / "plain-triton-cache")
        row("plain import + first call, Triton (fresh process, cold Triton cache)", round(wall, 2),
            build_s=round(build, 2))
    else:
        wall, build = plain_load_inline_s(forms["kernelbench"])
        row("plain load_inline, KernelBench form (fresh process)", round(wall, 2), build_s=round(build, 2))
    plain = rows[0]["seconds"] if rows else None

    async with ctx.warm_workers(2) as pool:
        async def settle() -> None:  # every wanted kind warm, as in a server that ran a while
            with anyio.fail_after(300):
                while not pool.settled():
                    await anyio.sleep(0.2)

        await settle()
        first_build_done = None
        for form, path in forms.items():
            if form in args.skip_form:
                continue
            text = variant(form, path.read_text(), 0)
            res, s = await timed(compile_kernel(ctx, CompileRequest(backend=backend, candidate_code=text,
                                                                    use_store=False)))
            assert res.ok, str(res)
            first_build_done = first_build_done or time.perf_counter()
            row(f"KForge compile_kernel, new candidate, {form} form", s, build_s=round(res.build_seconds, 3),
                fast_paths=sorted({p for b in res.builds for p in b.fast_paths}),
                vs_plain=round(s / plain, 3) if plain else None, **not_split(res))
            res, s = await timed(compile_kernel(ctx, CompileRequest(backend=backend, candidate_code=text,
                                                                    use_store=False)))
            row(f"KForge compile_kernel, repeated candidate, {form} form", s, from_cache=res.from_cache,
                build_s=round(res.build_seconds, 4))
        if backend == "cpu" or args.wait_pch:
            pch = home / "cache" / "pch"
            with anyio.fail_after(900):
                while not list(pch.glob("*/torch/extension.h.gch")):
                    await anyio.sleep(1)
            row("precompiled header ready (built in the background after the first build; once per flag set)",
                round(time.perf_counter() - first_build_done, 1))
            text = variant("kernelbench", forms["kernelbench"].read_text(), 1)
            res, s = await timed(compile_kernel(ctx, CompileRequest(backend=backend, candidate_code=text,
                                                                    use_store=False)))
            assert res.ok, str(res)
            row("KForge compile_kernel, new candidate, KernelBench form, header precompiled", s,
                build_s=round(res.build_seconds, 3), fast_paths=sorted({p for b in res.builds for p in b.fast_paths}),
                vs_plain=round(s / plain, 3) if plain else None, **not_split(res))

        fast_form = next(f for f in ("nvrtc", "triton", "kernelbench") if f in forms)

        async def turnaround(text: str, label: str) -> dict:
            stages = {}
            c, stages["compile"] = await timed(compile_kernel(ctx, CompileRequest(backend=backend,
                    candidate_code=text, use_store=False)))
            assert c.ok, str(c)
            v, stages["verify"] = await timed(verify_against_reference(ctx, VerifyRequest(backend=backend,
                    reference_code=reference, candidate_code=text, use_store=False)))
            assert v.correct, str(v)
            p, stages["profile"] = await timed(profile_kernel(ctx, ProfileRequest(backend=backend,
                    reference_code=reference, candidate_code=text, baselines=("eager",), hardware_counters=False,
                    budget_s=args.budget_s)))
            assert p.ok and p.output_correct, str(p)
            total = round(sum(stages.values()), 2)
            row(f"turnaround compile+verify+profile, {label}, {fast_form} form", total, **stages,
                trusted=p.speedup_trusted, speedup_eager=p.report.baselines[0].speedup)
            return stages

        text = variant(fast_form, forms[fast_form].read_text(), 2)
        await settle()
        await turnaround(text, "new candidate (cold)")
        warm = [await turnaround(text, "same candidate again (warm)" + (f", {k + 1} of {args.warm_repeats}"
                                                                         if args.warm_repeats > 1 else ""))
                for k in range(args.warm_repeats)]
        if len(warm) > 1:
            totals = [sum(w.values()) for w in warm]
            row(f"turnaround warm, median of {len(warm)}", round(statistics.median(totals), 2),
                min=round(min(totals), 2), max=round(max(totals), 2))

        if args.throughput:
            done = []

            mix = [(backend, fast_form, reference)] + [
                (b, f, example(b)["reference"]) for b in args.mix
                for f in [next(f for f in ("nvrtc", "triton", "kernelbench") if f in FORMS[b])]]

            async def one(i: int) -> None:
                b, form, ref = mix[i % len(mix)]  # a mixed set: the backends take turns
                t = variant(form, FORMS[b][form].read_text(), 100 + i)
                c = await compile_kernel(ctx, CompileRequest(backend=b, candidate_code=t, use_store=False))
                v = await verify_against_reference(ctx, VerifyRequest(backend=b, reference_code=ref, candidate_code=t,
                                                                      use_store=False))
                p = await profile_kernel(ctx, ProfileRequest(backend=b, reference_code=ref, candidate_code=t,
                                                             baselines=("eager",), hardware_counters=False,
                                                             budget_s=args.budget_s))
                done.append(c.ok and v.correct and p.ok)

            t0 = time.perf_counter()
            limiter = anyio.CapacityLimiter(args.parallel)

            async def limited(i: int) -> None:
                async with limiter:
                    await one(i)

            async with anyio.create_task_group() as tg:
                for i in range(args.throughput):
                    tg.start_soon(limited, i)
            wall = time.perf_counter() - t0
            forms_used = " + ".join(f"{b} {f}" for b, f, _ in mix)
            row(f"throughput: {args.throughput} new candidates ({forms_used}), compile+verify+profile, "
                f"{args.parallel} at once", round(wall, 2),
                per_minute=round(60 * len(done) / wall, 1), all_ok=all(done))
        out["pool"] = {"started": pool.started, "served": pool.served, "problems": pool.problems,
                       "targets": {f"{b} {dict(e) or ''}".strip(): n for (b, e), n in pool._target.items()}}
        write(out, args.out)
        if pool.problems:
            print("warm workers:", *pool.problems, sep="\n  ")
    return out


def write(result: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in (result["device"] or "unknown").lower()).strip("-")[:40]
    stem = out_dir / f"build-speed-{result['backend']}-{slug}-{result['date']}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [f"# Build speed and turnaround: {result['backend']} on {result['device']}, {result['date']}", "",
             "versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()), "",
             "| what | seconds | details |", "|---|---|---|"]
    for r in result["rows"]:
        details = ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("what", "seconds"))
        lines.append(f"| {r['what']} | {r['seconds']} | {details} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=sorted(FORMS), default="cpu")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--throughput", type=int, default=0, help="new candidates for the throughput row (0: skip)")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--mix", action="append", default=[], choices=sorted(FORMS),
                    help="throughput: candidates of this backend take turns with --backend's (a mixed set)")
    ap.add_argument("--budget-s", type=float, default=0.5, help="timing budget per timed model in profile_kernel")
    ap.add_argument("--warm-repeats", type=int, default=1, help="warm turnarounds to run (a median row when more than one)")
    ap.add_argument("--skip-plain", action="store_true")
    ap.add_argument("--skip-form", action="append", default=[], help="leave out this form's build rows (e.g. kernelbench)")
    ap.add_argument("--wait-pch", action="store_true", help="cuda: also wait for the precompiled header row")
    args = ap.parse_args()
    result = anyio.run(main, args)
    print(f"wrote {write(result, args.out)}.{{json,md}}")
