"""Load benchmark: N concurrent MCP clients, each submitting M jobs to one `kforge serve --transport http`.

Starts a token-protected server on loopback with a fresh data directory, then, in one run:
  1. baseline: jobs one at a time from one client on the idle server (the solo latency);
  2. load: N clients, each with its own HTTP session, submit their M jobs back to back (wait_s=0, so each
     call returns a job handle at once; a "busy" answer is retried after its retry_after_s) and then
     collect every result with get_job.
Jobs alternate compile_kernel and verify_against_reference (2 trials) of distinct candidates for the
`relu` problem (no C++ build: what is measured is the job system and the workers, not a compiler).

Checks that nothing is lost or duplicated: every submission yields exactly one result, carrying the
sha256 of the candidate it was sent, and the store holds exactly one finished job per candidate.
Prints a table and writes JSON + Markdown under bench/results/ (latency = submission to result in the
client; throughput = jobs per minute of wall time; ratios against the solo baseline of the same run).

Usage: python bench/load.py [--clients 4] [--jobs 4] [--backend cpu] [--parallel N] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import secrets
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2

from mcp import Client
from mcp.client.streamable_http import streamable_http_client

HERE = Path(__file__).resolve().parent
CANDIDATE = (HERE.parent / "tests" / "candidates" / "relu_python.py").read_text()
TOKEN = secrets.token_urlsafe(32)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(home: Path, port: int, parallel: int | None, queue_limit: int | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH", "CXX", "CC",
                                                       "CUDA_HOME", "LD_LIBRARY_PATH")}
    env.update(KFORGE_HOME=str(home), KFORGE_TOKEN=TOKEN)
    if parallel:
        env["KFORGE_PARALLEL_JOBS"] = str(parallel)
    if queue_limit:
        env["KFORGE_QUEUE_LIMIT"] = str(queue_limit)
    proc = subprocess.Popen([sys.executable, "-m", "kforge.server.cli", "serve", "--transport", "http", "--port",
                             str(port)], env=env, stdout=open(home / "server.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited; see {home / 'server.log'}")
            time.sleep(0.2)
    raise SystemExit("the server did not start within 60 s")


def _job(backend: str, i: int, tag: str) -> tuple[str, dict]:
    code = f"{CANDIDATE}\n# load benchmark {tag} job {i}\n"
    if i % 2 == 0:
        return "compile_kernel", {"backend": backend, "candidate_code": code, "wait_s": 0}
    return "verify_against_reference", {"backend": backend, "problem": "relu", "candidate_code": code, "trials": 2,
                                        "wait_s": 0}


class Recorder:
    def __init__(self) -> None:
        self.latencies: dict[str, list[float]] = {"compile_kernel": [], "verify_against_reference": []}
        self.busy_retries = 0
        self.job_ids: list[str] = []
        self.mismatched: list[str] = []
        self.failed: list[str] = []


async def _client(url: str, backend: str, tag: str, jobs: int, rec: Recorder) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=900)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            pending = []
            for i in range(jobs):
                tool, args = _job(backend, i, tag)
                t0 = time.perf_counter()
                while True:
                    answer = (await client.call_tool(tool, args)).structured_content
                    if answer.get("status") != "busy":
                        break
                    rec.busy_retries += 1
                    await anyio.sleep(answer["retry_after_s"])
                sha = hashlib.sha256(args["candidate_code"].encode()).hexdigest()
                pending.append((tool, t0, sha, answer))
            for tool, t0, sha, answer in pending:
                if "job_id" in answer and "status" in answer:
                    rec.job_ids.append(answer["job_id"])
                    while True:
                        result = await client.call_tool("get_job", {"job_id": answer["job_id"], "wait_s": 60})
                        answer = result.structured_content or {}
                        if result.is_error or answer.get("status") not in ("queued", "running"):
                            break
                rec.latencies[tool].append(time.perf_counter() - t0)
                if answer.get("spec", {}).get("candidate_sha256") != sha:
                    (rec.failed if answer.get("spec") is None else rec.mismatched).append(str(answer)[:300])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def _store_counts(home: Path) -> dict[str, int]:
    with sqlite3.connect(home / "kforge.db") as db:
        rows = db.execute("SELECT key, status FROM jobs").fetchall()
        service = db.execute("SELECT tool, finished_at - started_at FROM jobs WHERE status = 'done'").fetchall()
    keys = [k for k, _ in rows]
    return {"rows": len(rows), "done": sum(s == "done" for _, s in rows), "duplicate_keys": len(keys) - len(set(keys)),
            "service_s": {t: round(statistics.median([s for tt, s in service if tt == t]), 2)
                          for t in {t for t, _ in service}}}


async def _run(args: argparse.Namespace, url: str) -> dict:
    solo = Recorder()
    for i in range(args.solo):  # warm: the backend probe runs on the first call; then one at a time
        await _client(url, args.backend, f"solo{i}", 2, solo)
    rec = Recorder()
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for c in range(args.clients):
            tg.start_soon(_client, url, args.backend, f"client{c}", args.jobs, rec)
    wall = time.perf_counter() - t0
    every = [x for v in rec.latencies.values() for x in v]
    solo_all = [x for v in solo.latencies.values() for x in v[1:] or v]  # skip the probe-paying first call
    solo_p50 = statistics.median(solo_all)
    total = args.clients * args.jobs
    return {
        "clients": args.clients, "jobs_per_client": args.jobs, "jobs": total, "completed": len(every),
        "wall_s": round(wall, 2), "throughput_per_min": round(60 * len(every) / wall, 1),
        "latency_p50_s": round(_percentile(every, 50), 2), "latency_p99_s": round(_percentile(every, 99), 2),
        "latency_max_s": round(max(every), 2),
        "per_tool_p50_s": {t: round(statistics.median(v), 2) for t, v in rec.latencies.items() if v},
        "solo_latency_p50_s": round(solo_p50, 2), "solo_throughput_per_min": round(60 / solo_p50, 1),
        "throughput_vs_solo": round((60 * len(every) / wall) / (60 / solo_p50), 2),
        "busy_retries": rec.busy_retries, "distinct_job_ids": len(set(rec.job_ids)),
        "lost": total - len(every), "mismatched": len(rec.mismatched), "failed": len(rec.failed),
        "failures": rec.failed[:3] + rec.mismatched[:3],
    }


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("torch", "mcp"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=4, help="jobs per client")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--parallel", type=int, help="KFORGE_PARALLEL_JOBS for the server (default: its own)")
    ap.add_argument("--queue-limit", type=int, help="KFORGE_QUEUE_LIMIT (small: exercise the busy answers)")
    ap.add_argument("--solo", type=int, default=2, help="solo rounds (2 jobs each) for the baseline")
    ap.add_argument("--device", default=platform.node(), help="label for the results file")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="kforge-load-"))
    port = _free_port()
    server = _start_server(home, port, args.parallel, args.queue_limit)
    try:
        row = anyio.run(_run, args, f"http://127.0.0.1:{port}/mcp")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    row.update(store=_store_counts(home), backend=args.backend, parallel=args.parallel or "default",
               queue_limit=args.queue_limit or "default",
               cores=os.cpu_count(), device=args.device, date=time.strftime("%Y-%m-%d"), versions=_versions())
    row["store_ok"] = (row["store"]["done"] >= row["jobs"] and row["store"]["duplicate_keys"] == 0)

    header = ("| clients x jobs | parallel | queue limit | wall s | jobs/min | p50 s | p99 s | solo p50 s | throughput vs solo | "
              "busy retries | lost | mismatched | duplicated in store |")
    line = (f"| {row['clients']} x {row['jobs_per_client']} | {row['parallel']} | {row['queue_limit']} | {row['wall_s']} | "
            f"{row['throughput_per_min']} | {row['latency_p50_s']} | {row['latency_p99_s']} | "
            f"{row['solo_latency_p50_s']} | {row['throughput_vs_solo']}x | {row['busy_retries']} | {row['lost']} | "
            f"{row['mismatched']} | {row['store']['duplicate_keys']} |")
    table = "\n".join([header, "|" + "---|" * (header.count("|") - 1), line])
    print(table)
    print(f"per tool p50: {row['per_tool_p50_s']}; server-side service p50: {row['store']['service_s']}")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / (f"load-{args.backend}-{args.device}-{row['date']}-{args.clients}x{args.jobs}"
                       + (f"-queue{args.queue_limit}" if args.queue_limit else ""))
    stem.with_suffix(".json").write_text(json.dumps(row, indent=1))
    stem.with_suffix(".md").write_text(
        f"# Load: {row['clients']} clients x {row['jobs_per_client']} jobs, backend {args.backend}\n\n"
        f"{row['device']}, {row['cores']} cores, {row['date']}, {row['versions']}\n\n{table}\n\n"
        f"Per tool p50 latency (client): {row['per_tool_p50_s']}; server-side service time p50: "
        f"{row['store']['service_s']}.\nStore: {row['store']['rows']} job rows, {row['store']['done']} done.\n")
    print(f"wrote {stem}.json and .md")
    if row["lost"] or row["mismatched"] or row["failed"] or not row["store_ok"]:
        raise SystemExit("FAILED: jobs were lost, mixed up or duplicated (see the JSON)")


if __name__ == "__main__":
    main()
