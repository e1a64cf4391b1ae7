"""A fresh server's first call: `kforge serve` on a new data directory, then at once a verify of the ReLU problem with
an honest candidate, through the MCP SDK's stdio client (issue 16: a new server's first problem waits for its pool).

Per run it prints the seconds to the client's `initialize`, the verify's wall time, and when the byte-code cache,
the probe and the fork servers started and how long each took (from the server's trace). It measures the version it
runs from: to compare two, run it on each, one after the other on one quiet machine.

    python3 bench/first_call.py --backend cpu --runs 3 --out DIR
    python3 bench/first_call.py --backend cuda --runs 3 --restart   # run 0 a new data directory, then restarts
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent


async def _one(backend: str, home: Path, keep_trace: Path | None = None) -> dict:
    from mcp import Client, StdioServerParameters, stdio_client

    from kforge.server.catalog import problem_reference

    trace = home / "trace.jsonl"
    trace.unlink(missing_ok=True)  # a restart's own (`--restart`: one data directory for every run)
    env = {**os.environ, "KFORGE_HOME": str(home), "KFORGE_TRACE": str(trace)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "kforge.server.cli", "serve"], env=env)
    candidate = (HERE.parent / "tests" / "candidates" / "relu_python.py").read_text()
    started = time.perf_counter()
    with open(home / "server-stderr.log", "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            ready = time.perf_counter() - started
            t = time.perf_counter()
            result = await client.call_tool("verify_against_reference", {
                "backend": backend, "reference_code": problem_reference("relu"), "candidate_code": candidate,
                "use_store": False})
            verify = time.perf_counter() - t
    lines = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    if keep_trace is not None and trace.exists():  # every op of the run, to see where the first verify waited
        with gzip.open(keep_trace, "wt") as f:
            f.write(trace.read_text())
    at0 = min((line["at"] for line in lines), default=0.0)
    starts = {line["op"]: {"from_s": round(line["at"] - at0, 2), "s": line["s"]} for line in lines
              if line["role"] in ("pool", "probe", "server") and (line["op"].startswith("zygote")
                                                                   or line["op"] in ("probe", "bytecode"))}
    correct = bool((result.structured_content or {}).get("correct"))
    return {"initialize_s": round(ready, 2), "verify_s": round(verify, 2), "correct": correct, "starts": starts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or HERE / "out"))
    ap.add_argument("--tag", default="first-call")
    ap.add_argument("--keep-traces", action="store_true", help="also write each run's server trace (<tag>-run<i>-trace.jsonl.gz)")
    ap.add_argument("--restart", action="store_true", help="one data directory for every run: run 0 starts on a new "
                    "one, the next runs restart a server on it (its byte-code cache, ceilings and builds kept)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kforge-first-") as shared:
        for i in range(args.runs):
            new_home = contextlib.nullcontext(shared) if args.restart else tempfile.TemporaryDirectory(prefix="kforge-first-")
            with new_home as home:
                kept = args.out / f"{args.tag}-run{i}-trace.jsonl.gz" if args.keep_traces else None
                row = anyio.run(_one, args.backend, Path(home), kept)
            rows.append({**row, "data_directory": "kept from run 0" if args.restart and i else "new"})
            print(f"run {i}: initialize {row['initialize_s']} s, verify {row['verify_s']} s, correct {row['correct']}; "
                  f"{row['starts']}", flush=True)
    verify = [r["verify_s"] for r in rows]
    print(f"{args.tag}: verify median {statistics.median(verify):.2f} s (min {min(verify):.2f}, max {max(verify):.2f})")
    (args.out / f"{args.tag}.json").write_text(json.dumps({"backend": args.backend, "restart": args.restart,
                                                           "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
