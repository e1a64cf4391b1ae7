"""Where a fresh server's fork servers spend their start (issues 16 and 21: a new server's first problem).

On a fresh 2x H200 host (s24's trace) the three fork servers, started together, took 11.5-17 s in `_preload`:
8.8-11 s in "dynamo, extensions, profiler" and 6.5-6.7 s in "compilers' identities" (Inductor and Triton
imported ahead), so the first verify waited 16 s for its workers. This runs the same `_preload` in fresh
processes and tells apart the candidate causes:

- a cold page cache (the first process after boot reads torch from disk): the first run against the second;
- contention between fork servers started together: one alone against 3 and 6 at once;
- byte-code compiled on every start (the interpreter's packages carry none, and workers write none): the facts
  printed first, then the server's byte-code cache (`kforge.tools.process.bytecode`) made, and the same runs with it.

    python3 bench/explore/cold_start.py --out DIR     # on a GPU host, first in its call (the page cache is cold)

Prints a table and writes cold-start.json to --out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kforge.tools.process.bytecode import ensure_bytecode
from kforge.tools.process.lifecycle import worker_env

_CHILD = r"""
import json, os, sys, time
sys.dont_write_bytecode = "PYTHONPYCACHEPREFIX" not in os.environ  # as the fork server: it adds to the cache
t0 = time.perf_counter()
import torch
t_torch = time.perf_counter() - t0
from kforge.tools.harness.worker import _fork_server_env, _preload
os.environ.update(_fork_server_env(sys.argv[1]))  # as the fork server does before its preload
phases = _preload(sys.argv[1])
print(json.dumps({"backend": sys.argv[1], "import torch": round(t_torch, 3), **phases,
                  "total": round(time.perf_counter() - t0, 3)}))
"""


def _facts() -> dict:
    """Whether this interpreter's packages carry current byte-code, and whether it could be written there."""
    spec = importlib.util.find_spec("torch")
    root = Path(spec.origin).parent
    tag = sys.implementation.cache_tag
    py = list(root.rglob("*.py"))
    cached = sum(1 for p in py if (p.parent / "__pycache__" / f"{p.stem}.{tag}.pyc").exists())
    return {"python": sys.executable, "torch": str(root), "torch .py files": len(py),
            f"with a {tag} .pyc": cached, "torch dir writable": os.access(root, os.W_OK),
            "dont_write_bytecode": bool(sys.flags.dont_write_bytecode),
            "PYTHONPYCACHEPREFIX": os.environ.get("PYTHONPYCACHEPREFIX")}


def _run(backends: list[str], env: dict[str, str]) -> list[dict]:
    """`_preload` of each backend in a fresh process, all started together; their phases and the wall time."""
    t = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, b], env=env, stdout=subprocess.PIPE, text=True)
             for b in backends]
    rows = []
    for p in procs:
        out, _ = p.communicate()
        rows.append(json.loads(out.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.returncode})
    wall = round(time.perf_counter() - t, 3)
    return [{**r, "wall": wall} for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "bench/out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    facts = _facts()
    print(json.dumps(facts, indent=1))
    home = Path(tempfile.mkdtemp(prefix="kforge-cold-"))
    env = worker_env(home, home / "scratch")  # a fork server's environment, as the pool gives it
    env.pop("PYTHONPYCACHEPREFIX", None)
    keys = ["import torch", "backend module", "dynamo, extensions, profiler", "harness", "compilers' identities",
            "total", "wall"]
    print("| run | backend | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    results = []

    def run(name: str, backends: list[str], run_env: dict[str, str]) -> None:
        for row in _run(backends, run_env):
            results.append({"run": name, **row})
            print(f"| {name} | {row.get('backend', '?')} | " + " | ".join(str(row.get(k, "-")) for k in keys) + " |",
                  flush=True)

    run("cuda alone, first (cold page cache)", ["cuda"], env)
    run("cuda alone, again", ["cuda"], env)
    run("cpu, cuda, triton together", ["cpu", "cuda", "triton"], env)
    started = time.perf_counter()
    done = ensure_bytecode(home)  # the server's step before its probe (None: torch has its byte-code here)
    print(f"ensure_bytecode: {done} ({time.perf_counter() - started:.1f} s)", flush=True)
    if done is not None:
        cached = worker_env(home, home / "scratch")
        run("cpu, cuda, triton together, byte-code cache (they add to it)", ["cpu", "cuda", "triton"], cached)
        run("cuda alone, byte-code cache", ["cuda"], cached)
        run("cpu, cuda, triton together, byte-code cache", ["cpu", "cuda", "triton"], cached)
    (args.out / "cold-start.json").write_text(json.dumps({"facts": facts, "bytecode": done, "rows": results}, indent=1))


if __name__ == "__main__":
    main()
