"""What a hardened verify costs: wall time per stage of verify_against_reference, per candidate.

Stages come from the tool's own progress reports: the judge (reference, inputs, float64 outputs),
the candidate's build/load, the trials (each run twice, the second after NaN-poisoning, plus one
profiled call for the custom-work check), the comparison, and the null-model calibration.
Prints a table and writes JSON + Markdown under bench/results/.

Usage: python bench/verify_cost.py [--backend cpu] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CASES = {  # backend -> (label, problem or adversarial problem file, candidate path)
    "cpu": [
        ("relu, framework ops", "relu", "tests/candidates/relu_python.py"),
        ("relu, C++ extension", "relu", "tests/adversarial/candidates/honest_cpp_relu.py"),
        ("softmax 256x4096", "softmax", "tests/adversarial/candidates/honest_softmax.py"),
        ("matmul 256^3, blocked", "tests/adversarial/problems/matmul.py", "tests/adversarial/candidates/honest_blocked_matmul.py"),
    ],
}
STAGES = ["judge: reference, inputs, float64", "build/load candidate", "trials x2 + custom-work call", "compare",
          "null calibration + worker teardown"]


async def measure(backend: str, repeats: int, home: Path) -> dict:
    from kforge.server.catalog import problem_reference
    from kforge.tools.context import ToolContext
    from kforge.tools.evaluate import verify_against_reference
    from kforge.tools.requests import VerifyRequest

    ctx = ToolContext(home=home)
    avail = await ctx.require_backend(backend)
    rows = []
    for label, problem, cand in CASES[backend]:
        ref = (ROOT / problem).read_text() if problem.endswith(".py") else problem_reference(problem)
        code = (ROOT / cand).read_text()
        await verify_against_reference(ctx, VerifyRequest(backend=backend, reference_code=ref, candidate_code=code,
                                                          use_store=False))  # warm the build cache
        totals, stages = [], [[] for _ in STAGES]
        for _ in range(repeats):
            marks: list[float] = []

            async def progress(done: float, total: float | None, message: str) -> None:
                marks.append(time.perf_counter())

            t0 = time.perf_counter()
            result = await verify_against_reference(ctx, VerifyRequest(backend=backend, reference_code=ref,
                    candidate_code=code, use_store=False), progress=progress)
            totals.append(time.perf_counter() - t0)
            assert result.correct, str(result)
            for i in range(min(len(STAGES), len(marks) - 1)):
                stages[i].append(marks[i + 1] - marks[i])
        rows.append({"candidate": label, "verify_s": round(statistics.median(totals), 2),
                     **{s: round(statistics.median(v), 2) for s, v in zip(STAGES, stages) if v}})
    import torch
    return {"device": avail.device_name, "backend": backend, "date": time.strftime("%Y-%m-%d"), "repeats": repeats,
            "versions": {**avail.versions, "python": platform.python_version(), "torch": torch.__version__},
            "rows": rows}


def table(result: dict) -> str:
    cols = ["candidate", "verify_s", *STAGES]
    lines = [f"# Verify cost on {result['device']} ({result['backend']}), {result['date']}", "",
             "versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()),
             f"median of {result['repeats']} verifies (5 trials) after one warm-up verify (build cache warm); seconds", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in result["rows"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="cpu", choices=sorted(CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        result = anyio.run(measure, args.backend, args.repeats, Path(home))
    text = table(result)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"verify-cost-{args.backend}-{result['date']}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (args.out / f"{stem}.md").write_text(text)


if __name__ == "__main__":
    main()
