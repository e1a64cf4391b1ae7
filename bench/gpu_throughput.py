"""GPU throughput: new candidates through compile + verify + profile on 1 GPU against 2 GPUs (and a Ray fleet), one run.

Usage (from the repository root, with the checkout importable as the package `kforge`):

  python3 bench/gpu_throughput.py                    # 1gpu then 2gpu: cuda backend, 4 clients x 5 candidates, relu
  python3 bench/gpu_throughput.py --ray              # and then a local Ray head + one worker node, one GPU each
  python3 bench/gpu_throughput.py --backend cpu --clients 2 --candidates 2 --configs 1gpu 2gpu   # plumbing, no GPU

  On a GPU host from a plain checkout (no console script; wheels from .whl/, as bench/run_kernelbench_sample.sh):
    bash -c 'bash .whl/install.sh; export PYTHONPATH=/tmp/site:/tmp/kforge-pkg; mkdir -p /tmp/kforge-pkg;
             ln -sfn $PWD /tmp/kforge-pkg/kforge; python3 bench/gpu_throughput.py --ray --out ${OUT:-bench/results}'
  --ray needs Ray importable there (the carried wheels do not hold it by default: ../shared/gpu/fetch-wheels.sh ray).

  Options: --clients C (4) --candidates K (5 per client) --backend cuda|triton|cpu (cuda) --problem relu
  --candidate PATH (tests/candidates/relu_python.py: no build, runs on any device) --configs 1gpu 2gpu ray
  --ray (adds the ray config) --baselines eager [torch.compile] (eager) --trials 5 --budget-s S (server default)
  --warmup 1 (candidates per device before the clock starts; 0: none) --config-timeout-s 200 --parallel N
  --allow-partial-sandbox --server-env KEY=VALUE ... --out DIR (bench/results) --tag TAG (files gpu-throughput-<tag>.json and .md).

Each configuration runs one after another with its own fresh data directory and its own token-protected
`python3 -m kforge.server.cli serve --transport http` on loopback (as bench/load.py):
  - 1gpu: the server sees one GPU (CUDA_VISIBLE_DEVICES=<the first visible GPU>);
  - 2gpu: the server sees two (the first two visible GPUs): each GPU is a device with its own queue and workers;
  - ray:  a local Ray cluster (`ray.cluster_utils.Cluster`, started in this process and shut down afterwards,
          so that only its own processes are stopped): a head node with the first GPU and one worker node with
          the second (each node's processes see only its GPU), half the cores each; then
          `serve --ray <head address>`, every job a Ray task on a node (README: Fleet (Ray)).
Workload: C concurrent MCP clients (streamable HTTP, one session each), each with K candidates, all in flight at once
(a burst: every candidate's first process is forked at the window's start, and the host starts device contexts
one at a time, ~4 per second on any number of GPUs) or --in-flight N at a time (steady: an agent's next candidate
as one ends);
every candidate is the candidate file plus a comment with its own counter (distinct text: nothing comes from the
result store; use_store=false too) and goes compile_kernel -> verify_against_reference -> profile_kernel
(hardware_counters=false), `gpu` left out so the server places each job on the least loaded GPU. Each call is
submitted with wait_s=0 (a job handle at once; a "busy" answer is retried after retry_after_s) and collected
with get_job, so up to C x K jobs are in flight. Before the clock starts, --warmup candidates per device go
through the same three tools (pinned with gpu=i on a local server of several GPUs) so that workers, probes and
baselines are warm: the measured window is steady throughput, the warm-up is reported beside it.

Measured per configuration: wall time of the measured window, candidates per minute (a candidate counts once its
compile, verify and profile all returned a result; "good" ones were built, CORRECT and profiled with a correct
output), the ratios 2gpu/1gpu (goal: >= 1.8) and ray/2gpu, per GPU (`spec.gpu` of each result, told apart by
uuid: on Ray nodes every GPU is index 0) the jobs it ran and the noise of the candidate's profile timings
(spread of the per-profile median_us: (max-min)/median and IQR/median; also the median within-profile
IQR/median), every failure (a non-correct verdict, a failed build or profile, a tool error, a result for another
candidate, a job unfinished at --config-timeout-s) counted and listed, and that every submission got exactly one
result (distinct job ids, each one row in the server's job store, done). Records device names, driver, versions
(torch, triton, mcp, ray, KForge and its git commit) and the date. Writes JSON + Markdown after every
configuration, so what ran survives an interrupted run. With one GPU, 2gpu equals 1gpu (said in the output);
with --backend cpu no configuration has a GPU and the ratios mean nothing (said too).
"""

from __future__ import annotations

import argparse
import gzip
import csv
import hashlib
import io
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import anyio
import httpx2

from mcp import Client
from mcp.client.streamable_http import streamable_http_client

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from host_load import HostLoad  # noqa: E402 - bench/ is no package: its sibling module, found through the path
from kernelbench_sample import as_candidate  # noqa: E402 - the same
TOKEN = secrets.token_urlsafe(32)
TOOLS = ("compile_kernel", "verify_against_reference", "profile_kernel")
CONFIGS = ("1gpu", "2gpu", "ray")
ACTIVE = ("queued", "running", "cancelling")


# ---------------------------------------------------------------------------------------------------------------
# The host: its GPUs and versions
# ---------------------------------------------------------------------------------------------------------------
def _nvidia_smi() -> list[dict[str, str]]:
    """Every GPU as nvidia-smi lists it (index, name, uuid, driver, memory, bus), [] without nvidia-smi."""
    fields = "index,name,uuid,driver_version,memory.total,pci.bus_id"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    rows = []
    for row in csv.reader(io.StringIO(out.stdout)):
        if len(row) == 6:
            rows.append(dict(zip(fields.split(","), (c.strip() for c in row))))
    return rows


def _visible_gpus(backend: str) -> tuple[list[str], list[dict[str, str]], str]:
    """The GPUs this run may use, as CUDA_VISIBLE_DEVICES entries (uuids where known), their nvidia-smi rows, and a
    note on how they were found. None for the cpu backend."""
    smi = _nvidia_smi()
    if backend == "cpu":
        return [], smi, "cpu backend: no configuration uses a GPU"
    env = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    if "CUDA_VISIBLE_DEVICES" in os.environ and not env:
        return [], smi, "CUDA_VISIBLE_DEVICES is empty: no GPU"
    if env:  # the host's own choice, in its order
        rows = []
        for e in env:
            match = [r for r in smi if (e.isdigit() and r["index"] == e)
                     or (not e.isdigit() and r["uuid"].lower().removeprefix("gpu-").startswith(
                         e.lower().removeprefix("gpu-")))]
            rows.append(match[0] if len(match) == 1 else {"index": e, "name": "?", "uuid": ""})
        return env, rows, f"from CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}"
    if smi:  # pinned by uuid: whatever order CUDA enumerates them in
        return [r["uuid"] or r["index"] for r in smi], smi, "from nvidia-smi (pinned by uuid)"
    try:  # no nvidia-smi: ask torch in a child (this process starts no CUDA)
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                               capture_output=True, text=True, timeout=120)
        count = int(probe.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        count = 0
    return [str(i) for i in range(count)], [{"index": str(i), "name": "?", "uuid": ""} for i in range(count)], \
        "from torch.cuda.device_count() (no nvidia-smi)"


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("torch", "triton", "mcp", "pydantic", "ray", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        import kforge

        out["kforge"] = kforge.__version__
    except Exception:  # noqa: BLE001 - the record must not fail on it
        m = re.search(r'^version\s*=\s*"([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
        out["kforge"] = m.group(1) if m else "?"
    try:
        git = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %cs %s"], capture_output=True,
                             text=True, timeout=10)
        if git.returncode == 0 and git.stdout.strip():
            out["kforge_commit"] = git.stdout.strip()[:100]
            dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            out["kforge_worktree"] = "modified" if dirty else "clean"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


# ---------------------------------------------------------------------------------------------------------------
# A server of one configuration (and its Ray cluster)
# ---------------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_env(home: Path, args: argparse.Namespace) -> dict[str, str]:
    """This process's environment without KForge's settings (and Ray's address), with the run's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_") and k not in ("RAY_ADDRESS",)}
    env.update(KFORGE_HOME=str(home), KFORGE_TOKEN=TOKEN, KFORGE_CONFIG=str(home / "no-config.toml"),
               KFORGE_TRACE=str(home / "trace.jsonl"), PYTHONUNBUFFERED="1")
    if args.parallel:
        env["KFORGE_PARALLEL_JOBS"] = str(args.parallel)
    if args.allow_partial_sandbox:
        env["KFORGE_ALLOW_PARTIAL_SANDBOX"] = "1"
    env.update(kv.split("=", 1) for kv in args.server_env)  # e.g. KFORGE_MAX_FORKS=4 for an A/B
    return env


def _start_server(home: Path, port: int, env: dict[str, str], extra: list[str]) -> subprocess.Popen:
    log = open(home / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "kforge.server.cli", "serve", "--transport", "http", "--port",
                             str(port), *extra], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited ({proc.returncode}): {_last_line(home / 'server.log')}")
            time.sleep(0.2)
    _stop(proc)
    raise RuntimeError(f"the server did not start within 120 s: {_last_line(home / 'server.log')}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()  # this server only (its own pid), never by name
            proc.wait(timeout=30)


def _last_line(path: Path) -> str:
    lines = [line for line in _tail(path).splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing in its log)"


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def _one_each(row: dict) -> str:
    """The table's "one result each": a window cut at --config-timeout-s leaves submissions unanswered and jobs the
    clients had no handle for yet, which is the cut, not a lost or doubled result."""
    one = row["exactly_one_result"]
    if one["ok"]:
        return "yes"
    if row.get("timed_out") and one["distinct_job_ids"] == one["job_handles"] and not one["handles_absent_from_store"]:
        return f"cut by the window ({one['results']} of {one['submissions']} answered, none twice)"
    return "NO"


def _start_ray(gpu_ids: list[str], cores: int, tmp: Path):
    """A local Ray cluster: a head with the first GPU and one worker node with the second (none where the host has
    one), half the cores each. Each node's processes inherit CUDA_VISIBLE_DEVICES as it is set here when the node
    starts (restored afterwards), so each node's tasks see only its own GPU."""
    import ray  # noqa: F401 - ImportError: said in the results
    from ray.cluster_utils import Cluster

    cpus = max(1, cores // 2)
    common = {"num_cpus": cpus, "object_store_memory": 512 * 2**20, "include_dashboard": False}
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")

    def visible(ids: list[str], gpus_wanted: bool) -> None:
        if ids or gpus_wanted:  # a node without a GPU on a GPU run: "" (its probe must not see one either)
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
        elif saved is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
        else:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)

    head_ids, worker_ids = gpu_ids[:1], gpu_ids[1:2]
    try:
        visible(head_ids, bool(gpu_ids))
        # Every node, and the address file a node reads to join the head, under `tmp`: a head's own temp_dir
        # alone left the worker node looking in /tmp/ray for it (Ray 2.60 on a fresh host, 2026-11-27).
        os.environ["RAY_TMPDIR"] = str(tmp)
        cluster = Cluster(initialize_head=True, head_node_args={**common, "num_gpus": len(head_ids)})
        try:
            visible(worker_ids, bool(gpu_ids))
            cluster.add_node(**common, num_gpus=len(worker_ids))
            cluster.wait_for_nodes()
        except BaseException:
            cluster.shutdown()
            raise
    finally:
        visible([], False)
    layout = {"address": cluster.address, "head": {"cpus": cpus, "gpus": head_ids},
              "worker": {"cpus": cpus, "gpus": worker_ids}, "how": "ray.cluster_utils.Cluster in the benchmark's process"}
    return cluster, layout


# ---------------------------------------------------------------------------------------------------------------
# The clients
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Stage:
    tool: str
    job_id: str | None = None
    latency_s: float | None = None
    result: dict | None = None
    error: str | None = None


@dataclass
class Candidate:
    label: str
    sha: str
    stages: dict[str, Stage] = field(default_factory=dict)
    done_at: float | None = None  # perf_counter when its last stage answered


@dataclass
class Recorder:
    candidates: list[Candidate] = field(default_factory=list)
    busy_retries: int = 0
    job_ids: list[str] = field(default_factory=list)
    inflight: set[str] = field(default_factory=set)


def _args_for(tool: str, args: argparse.Namespace, code: str, gpu: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": args.backend, "candidate_code": code, "use_store": False, "wait_s": 0}
    problem = {"reference_code": args.reference_code} if args.reference_code else {"problem": args.problem}
    if tool == "verify_against_reference":
        out.update(problem, trials=args.trials)
    elif tool == "profile_kernel":
        out.update(problem, hardware_counters=False, baselines=args.baselines)
        if args.budget_s:
            out["budget_s"] = args.budget_s
    if gpu is not None:
        out["gpu"] = gpu
    return out


def _text(result) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)[:400]


async def _stage(client: Client, tool: str, call: dict[str, Any], rec: Recorder) -> Stage:
    stage = Stage(tool)
    t0 = time.perf_counter()
    try:
        while True:
            result = await client.call_tool(tool, call)
            answer = result.structured_content or {}
            if result.is_error:
                stage.error = f"tool error: {_text(result)}"
                return stage
            if answer.get("status") != "busy":
                break
            rec.busy_retries += 1
            await anyio.sleep(answer.get("retry_after_s") or 1.0)
        if "spec" not in answer and answer.get("job_id"):
            stage.job_id = job_id = answer["job_id"]
            rec.job_ids.append(job_id)
            rec.inflight.add(job_id)
            while answer.get("status") in ACTIVE:
                result = await client.call_tool("get_job", {"job_id": job_id, "wait_s": 30})
                answer = result.structured_content or {}
                if result.is_error:
                    stage.error = f"job failed: {_text(result)}"
                    break
            rec.inflight.discard(job_id)
        if stage.error is None:
            if "spec" in answer:
                stage.result = answer
            else:
                stage.error = f"no result: status {answer.get('status')!r}: {answer.get('message') or answer}"[:400]
    except Exception as exc:  # noqa: BLE001 - counted and listed, never dropped
        stage.error = f"{type(exc).__name__}: {exc}"[:400]
    finally:
        stage.latency_s = time.perf_counter() - t0
    return stage


async def _pipeline(client: Client, args: argparse.Namespace, code: str, label: str, gpu: int | None,
                    rec: Recorder) -> None:
    cand = Candidate(label, hashlib.sha256(code.encode()).hexdigest())
    rec.candidates.append(cand)
    for tool in TOOLS:  # each stage after the one before, as an agent would; all three run whatever the verdict
        cand.stages[tool] = await _stage(client, tool, _args_for(tool, args, code, gpu), rec)
    cand.done_at = time.perf_counter()


def _session(url: str):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=900)), url


async def _client(url: str, args: argparse.Namespace, jobs: list[tuple[str, str, int | None]], rec: Recorder) -> None:
    """One MCP client: its candidates' pipelines, at most `--in-flight` at once (default: all), in order."""
    http, url = _session(url)
    slots = anyio.Semaphore(args.in_flight or len(jobs) or 1)

    async def one(code: str, label: str, gpu: int | None) -> None:
        async with slots:
            await _pipeline(client, args, code, label, gpu, rec)

    async with http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            async with anyio.create_task_group() as tg:
                for code, label, gpu in jobs:
                    tg.start_soon(one, code, label, gpu)


async def _one_session(url: str, fn):
    http, url = _session(url)
    async with http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            return await fn(client)


async def _cancel(url: str, job_ids: list[str]) -> None:
    async def cancel(client: Client) -> None:
        for job_id in job_ids:
            with anyio.move_on_after(60):
                await client.call_tool("cancel_job", {"job_id": job_id})

    if job_ids:
        await _one_session(url, cancel)


async def _drive(args: argparse.Namespace, url: str, config: str, candidate: str, ray_nodes: int, server_pid: int,
                 traces: list[Path]) -> dict:
    """List the backends, warm up, then the measured window; the clients' records, the host's load and where the
    server's and its workers' time went during the window."""
    nonce = secrets.token_hex(4)

    async def backends(client: Client) -> list[dict]:
        with anyio.fail_after(300):
            result = await client.call_tool("list_backends", {})
        return (result.structured_content or {}).get("backends", [])

    found = {b["backend"]: b for b in await _one_session(url, backends)}
    avail = found.get(args.backend)
    if avail is None or not avail.get("ok"):
        why = avail.get("reason") if avail else f"unknown backend; the server knows {sorted(found)}"
        return {"error": f"backend {args.backend!r} is not available in config {config}: {why}", "backend_info": avail}
    server_gpus = avail.get("gpus") or []
    out: dict[str, Any] = {"backend_info": {k: avail.get(k) for k in ("reason", "device_name", "versions", "mode",
                                                                      "timing")},
                           "server_gpus": [{k: g.get(k) for k in ("index", "name", "uuid", "pci_bus_id", "memory_bytes")}
                                           for g in server_gpus]}

    def code_of(label: str) -> str:
        return f"{candidate}\n# gpu throughput benchmark {config} {nonce} {label}\n"

    # Warm-up: a candidate per device, side by side (pinned to each GPU of a local multi-GPU server).
    warm = Recorder()
    devices = ray_nodes if config == "ray" else max(1, len(server_gpus))
    if args.warmup:
        pin = config != "ray" and len(server_gpus) > 1
        jobs = [(code_of(f"warm{i}"), f"warm{i}", server_gpus[i % len(server_gpus)]["index"] if pin else None)
                for i in range(args.warmup * devices)]
        t0 = time.perf_counter()
        with anyio.move_on_after(args.config_timeout_s / 2):
            await _client(url, args, jobs, warm)
        unfinished = sorted(warm.inflight)
        await _cancel(url, unfinished)  # a warm-up past its time must not run into the measured window
        out["warmup"] = {"candidates": len(jobs), "wall_s": round(time.perf_counter() - t0, 2),
                         "cancelled_unfinished": len(unfinished),
                         "errors": [f"{c.label} {s.tool}: {s.error}" for c in warm.candidates
                                    for s in c.stages.values() if s.error][:10]}

    # The measured window.
    rec = Recorder()
    trace_from = {t: t.stat().st_size if t.exists() else 0 for t in traces}
    # On Ray the jobs run in the local cluster's processes, children of this process (the clients' share is small).
    load = HostLoad(server_pid, also=(os.getpid(),) if config == "ray" else ()).start()
    t0 = time.perf_counter()
    with anyio.move_on_after(args.config_timeout_s) as scope:
        async with anyio.create_task_group() as tg:
            for c in range(args.clients):
                jobs = [(code_of(f"c{c}k{k}"), f"c{c}k{k}", None) for k in range(args.candidates)]
                tg.start_soon(_client, url, args, jobs, rec)
    wall = time.perf_counter() - t0
    window = _window_lines(trace_from)
    out["host_load"], out["ops"] = load.stop(), _trace_ops(window)
    if args.keep_traces:  # every op of the window, for a closer look (which GPU, which process, when)
        args.out.mkdir(parents=True, exist_ok=True)
        kept = args.out / f"gpu-throughput-{args.tag}-{config}-trace.jsonl.gz"
        with gzip.open(kept, "wt") as f:
            f.writelines(json.dumps(e) + "\n" for e in window)
        out["trace_file"] = kept.name
    out["timed_out"] = scope.cancelled_caught
    if left := sorted(rec.inflight):  # past --config-timeout-s: cancel what still runs, and say so
        await _cancel(url, left)
        out["cancelled_at_timeout"] = left
    out.update(wall_s=wall, window_t0=t0, recorder=rec, warm_recorder=warm)
    return out


def steady_rate(done_s: list[float]) -> dict[str, Any] | None:
    """Candidates per minute between the completion of the first sixth and of the last sixth (the 8th and 40th of
    48): the window without its start-up (forks, device contexts) and its drain (fewer in flight than the clients
    keep), which weigh more in a shorter window. None with fewer than 12 completions."""
    done = sorted(done_s)
    cut = -(-len(done) // 6)
    if len(done) < 12 or done[-cut - 1] <= done[cut - 1]:
        return None
    lo, hi = cut - 1, len(done) - cut - 1
    return {"per_min": round(60 * (hi - lo) / (done[hi] - done[lo]), 2), "from_s": round(done[lo], 2),
            "to_s": round(done[hi], 2), "completions": f"completions {lo + 1}-{hi + 1}"}


def _window_lines(traces: dict[Path, int]) -> list[dict]:
    """The lines of the traces (KFORGE_TRACE: the server's; on Ray also its nodes' agents', `NodeConfig.trace`), each
    read from its offset."""
    lines = []
    for trace, offset in traces.items():
        if not trace.exists():
            continue
        with open(trace) as f:
            f.seek(offset)
            for line in f:
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    continue  # a line being written as the window closed
    return lines


def _trace_ops(window: list[dict], top: int = 20) -> dict[str, dict[str, float]]:
    """Per op of the window's trace lines: count, seconds in all, median seconds; the `top` largest in all. A fork's
    op names its GPU pin: those of one backend count together."""
    spans: dict[str, list[float]] = {}
    for e in window:
        op = e["op"].split(" CUDA_VISIBLE_DEVICES=")[0]
        spans.setdefault(f"{e['role']}.{op}", []).append(e["s"])
    ops = {k: {"n": len(v), "total_s": round(sum(v), 2), "p50_s": round(statistics.median(v), 3)}
           for k, v in spans.items()}
    return dict(sorted(ops.items(), key=lambda kv: -kv[1]["total_s"])[:top])


# ---------------------------------------------------------------------------------------------------------------
# What the results say
# ---------------------------------------------------------------------------------------------------------------
def _gpu_key(spec: dict | None, smi: dict[str, dict[str, str]]) -> tuple[str, str]:
    """(key, label) of the GPU a result names: by uuid (each Ray node calls its own GPU 0), else by index."""
    gpu = (spec or {}).get("gpu")
    if not gpu:
        return "none", "no GPU (spec.gpu empty)"
    uuid = gpu.get("uuid") or ""
    row = smi.get(uuid)
    physical = f"GPU {row['index']}" if row else f"GPU index {gpu.get('index')}"
    return (uuid or f"index {gpu.get('index')}"), f"{physical} ({gpu.get('name')}{', ' + uuid[:12] if uuid else ''})"


def _spread(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0}
    med = statistics.median(values)
    iqr = 0.0
    if len(values) >= 2:
        q = statistics.quantiles(values, n=4, method="inclusive")
        iqr = q[2] - q[0]
    return {"n": len(values), "median_us": round(med, 3), "min_us": round(min(values), 3),
            "max_us": round(max(values), 3),
            "range_over_median": round((max(values) - min(values)) / med, 4) if med else None,
            "iqr_over_median": round(iqr / med, 4) if med else None}


def _failure(cand: Candidate, stage: Stage) -> str | None:
    """Why this stage's answer is no success, or None."""
    if stage.error:
        return stage.error
    r = stage.result or {}
    if (r.get("spec") or {}).get("candidate_sha256") != cand.sha:
        return f"a result for another candidate (sha {str((r.get('spec') or {}).get('candidate_sha256'))[:12]})"
    if stage.tool == "compile_kernel" and not r.get("ok"):
        return f"compile failed: {(r.get('failure') or {}).get('message', '?')}"[:300]
    if stage.tool == "verify_against_reference" and not r.get("correct"):
        hard = [c.get("name") for c in r.get("checks", []) if c.get("hard") and c.get("status") == "fail"]
        why = (r.get("failure") or {}).get("message") or f"failed checks {hard}"
        return f"verdict WRONG: {why}"[:300]
    if stage.tool == "profile_kernel":
        if not r.get("ok") or not (r.get("report") or {}).get("candidate"):
            return f"not profiled: {(r.get('failure') or {}).get('message', '?')}"[:300]
        if r.get("output_correct") is False:
            return "profiled output did not match the reference"
    return None


def _store_rows(home: Path) -> dict[str, dict]:
    try:
        with sqlite3.connect(home / "kforge.db") as db:
            rows = db.execute("SELECT job_id, tool, device, status, created_at, started_at, finished_at, message "
                              "FROM jobs").fetchall()
    except sqlite3.Error as exc:
        return {"__error__": {"message": str(exc)}}
    names = ("job_id", "tool", "device", "status", "created_at", "started_at", "finished_at", "message")
    return {r[0]: dict(zip(names, r)) for r in rows}


def _summarize(config: str, drive: dict, store: dict[str, dict], smi: dict[str, dict[str, str]],
               args: argparse.Namespace) -> dict:
    rec: Recorder = drive.pop("recorder")
    warm: Recorder = drive.pop("warm_recorder")
    wall = drive.pop("wall_s")
    t0 = drive.pop("window_t0")
    pushed = args.clients * args.candidates
    failures, untrusted, timing_checks, profiles = [], [], [], []
    per_gpu: dict[str, dict] = {}
    latencies: dict[str, list[float]] = {t: [] for t in TOOLS}
    completed = good = 0
    for cand in rec.candidates:
        ok_all = len(cand.stages) == len(TOOLS)
        done_all = ok_all
        for tool in TOOLS:
            stage = cand.stages.get(tool)
            if stage is None:
                failures.append(f"{cand.label} {tool}: no result (stopped at --config-timeout-s)")
                continue
            if stage.result is None:
                done_all = False
            elif stage.latency_s is not None:
                latencies[tool].append(stage.latency_s)
            why = _failure(cand, stage)
            if why:
                ok_all = False
                failures.append(f"{cand.label} {tool}: {why}")
            if stage.result is None:
                continue
            key, label = _gpu_key(stage.result.get("spec"), smi)
            gpu = per_gpu.setdefault(key, {"label": label, "jobs": {t: 0 for t in TOOLS}, "profile_medians_us": [],
                                           "profile_iqr_over_median": [], "eager_medians_us": [], "ray_nodes": {}})
            gpu["jobs"][tool] += 1
            row = store.get(stage.job_id or "")
            if row and (m := re.search(r"on Ray node (\w+)", row.get("message") or "")):
                gpu["ray_nodes"][m.group(1)] = gpu["ray_nodes"].get(m.group(1), 0) + 1
            if tool == "profile_kernel" and why is None:
                report = stage.result["report"]
                c = report["candidate"]
                eager = next((b for b in report.get("baselines", []) if b.get("name") == "eager"), {})
                iqr = (c["q3_us"] - c["q1_us"]) / c["median_us"] if c.get("median_us") else None
                # Each profile on its own, in the order they finished: when in the window the noisy ones came.
                profiles.append({"candidate": cand.label, "gpu": label,
                                 "done_s": round(cand.done_at - t0, 2) if cand.done_at is not None else None,
                                 "median_us": c["median_us"],
                                 "iqr_over_median": round(iqr, 5) if iqr is not None else None,
                                 "eager_median_us": (eager.get("timing") or {}).get("median_us"),
                                 "speedup": eager.get("speedup"), "speedup_ci": eager.get("speedup_ci"),
                                 "trusted": stage.result.get("speedup_trusted")})
                gpu["profile_medians_us"].append(c["median_us"])
                if iqr is not None:
                    gpu["profile_iqr_over_median"].append(iqr)
                for b in report.get("baselines", []):
                    if b.get("name") == "eager" and b.get("timing"):
                        gpu["eager_medians_us"].append(b["timing"]["median_us"])
                # The timing checks' own evidence, trusted or not: what an untrusted profile read, in numbers.
                timing_checks += [f"{cand.label} {ch.get('name')} [{ch.get('status')}]: {ch.get('evidence')}"
                                  for ch in stage.result.get("checks", [])
                                  if ch.get("name") in ("wall_clock_anchor", "stable_timing")]
                if stage.result.get("speedup_trusted") is False:
                    failed = [ch.get("name") for ch in stage.result.get("checks", []) if ch.get("status") == "fail"]
                    untrusted.append(f"{cand.label} on {label}: speedup not trusted ({', '.join(failed) or '?'})")
        completed += done_all
        good += ok_all
    missing = pushed - len(rec.candidates)
    if missing:
        failures.append(f"{missing} candidate(s) never started (the timeout)")
    gpus = {}
    for key, g in sorted(per_gpu.items(), key=lambda kv: kv[1]["label"]):
        within = g["profile_iqr_over_median"]
        gpus[key] = {"label": g["label"], "jobs": g["jobs"], "candidate_profile": _spread(g["profile_medians_us"]),
                     "within_profile_iqr_over_median": round(statistics.median(within), 4) if within else None,
                     "eager_profile": _spread(g["eager_medians_us"]), **({"ray_nodes": g["ray_nodes"]}
                                                                        if g["ray_nodes"] else {})}
    # Exactly one result per submission: distinct job ids, each one row of the server's store, done.
    measured = [s for c in rec.candidates for s in c.stages.values()]
    ids = [s.job_id for s in measured if s.job_id]
    not_done = [f"{j}: {store[j]['status']}" for j in ids if j in store and store[j]["status"] != "done"]
    absent = [j for j in ids if j not in store]
    warm_ids = {s.job_id for c in warm.candidates for s in c.stages.values() if s.job_id}
    extra_rows = [j for j in store if j not in set(ids) | warm_ids and j != "__error__"]
    results = sum(s.result is not None for s in measured)
    exactly_one = {
        "submissions": pushed * len(TOOLS), "results": results, "job_handles": len(ids),
        "distinct_job_ids": len(set(ids)), "answered_without_handle": sum(s.result is not None and not s.job_id
                                                                         for s in measured),
        "store_rows_not_done": not_done[:10], "handles_absent_from_store": absent[:10],
        "store_rows_nobody_submitted": extra_rows[:10], "busy_retries": rec.busy_retries,
    }
    exactly_one["ok"] = (results == pushed * len(TOOLS) and len(set(ids)) == len(ids) and not not_done
                         and not absent and not extra_rows and "__error__" not in store)
    service = {t: [r["finished_at"] - r["started_at"] for j, r in store.items() if j in set(ids) and r.get("tool") == t
                   and r.get("started_at") and r.get("finished_at")] for t in TOOLS}
    waited = {t: [r["started_at"] - r["created_at"] for j, r in store.items() if j in set(ids) and r.get("tool") == t
                  and r.get("started_at") and r.get("created_at")] for t in TOOLS}
    drive.update(
        config=config, candidates_pushed=pushed, candidates_completed=completed, candidates_good=good,
        wall_s=round(wall, 2), candidates_per_min=round(60 * completed / wall, 2) if wall else None,
        steady=steady_rate([c.done_at - t0 for c in rec.candidates if c.done_at is not None
                            and all(s.result is not None for s in c.stages.values()) and len(c.stages) == len(TOOLS)]),
        good_per_min=round(60 * good / wall, 2) if wall else None, gpus=gpus,
        latency_p50_s={t: round(statistics.median(v), 2) for t, v in latencies.items() if v},
        server_queue_wait_p50_s={t: round(statistics.median(v), 2) for t, v in waited.items() if v},
        server_service_p50_s={t: round(statistics.median(v), 2) for t, v in service.items() if v},
        devices_in_store=sorted({r["device"] for j, r in store.items() if j in set(ids)}),
        failures_count=len(failures), failures=failures, untrusted_speedups=untrusted, timing_checks=timing_checks,
        profiles=sorted(profiles, key=lambda p: (p["done_s"] is None, p["done_s"] or 0)), exactly_one_result=exactly_one)
    return drive


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _compare(report: dict) -> tuple[dict, list[str]]:
    rows = report["configs"]
    rate = {k: v.get("candidates_per_min") for k, v in rows.items() if not v.get("error")}
    out: dict[str, Any] = {}
    lines = []
    meaningless = report["run"]["ratio_note"]
    if rate.get("1gpu") and rate.get("2gpu"):
        r = rate["2gpu"] / rate["1gpu"]
        out["2gpu_over_1gpu"] = round(r, 3)
        verdict = "n/a" if meaningless else ("met" if r >= 1.8 else "NOT met")
        lines.append(f"throughput 2gpu / 1gpu: {r:.2f}x (goal >= 1.8x: {verdict})" + (f" [{meaningless}]"
                                                                                      if meaningless else ""))
    for config in ("1gpu", "2gpu"):  # a server whose jobs never queued was not kept busy: its rate is a floor
        waits = rows.get(config, {}).get("server_queue_wait_p50_s") or {}
        if rate.get(config) and waits and all(w is not None and w <= 0.05 for w in waits.values()):
            out[f"{config}_unsaturated"] = True
            lines.append(f"{config}: no job waited in a queue at the median ({', '.join(f'{t} {w:g} s' for t, w in waits.items())}): "
                         "its devices were not kept busy, so its rate is a floor of what they can do, and a ratio with it "
                         "is a floor or a ceiling; raise --in-flight or --clients to fill them")
    steady = {k: (v.get("steady") or {}).get("per_min") for k, v in rows.items() if not v.get("error")}
    if steady.get("1gpu") and steady.get("2gpu"):
        r = steady["2gpu"] / steady["1gpu"]
        out["steady_2gpu_over_1gpu"] = round(r, 3)
        lines.append(f"steady throughput 2gpu / 1gpu (start-up and drain left out, `steady`): {r:.2f}x "
                     f"({steady['2gpu']:g} against {steady['1gpu']:g}/min)")
    if rate.get("ray") and rate.get("2gpu"):
        r = rate["ray"] / rate["2gpu"]
        out["ray_over_2gpu"] = round(r, 3)
        lines.append(f"throughput ray / 2gpu: {r:.2f}x" + (f" [{meaningless}]" if meaningless else ""))
    if rate.get("ray") and rate.get("1gpu"):
        out["ray_over_1gpu"] = round(rate["ray"] / rate["1gpu"], 3)

    def worst(config: str, metric: str) -> float | None:
        vals = [g["candidate_profile"].get(metric) for g in rows.get(config, {}).get("gpus", {}).values()
                if g["candidate_profile"].get("n", 0) >= 2]
        vals = [v for v in vals if v is not None]
        return max(vals) if vals else None

    for metric, name in (("iqr_over_median", "IQR/median"), ("range_over_median", "(max-min)/median")):
        base = worst("1gpu", metric)
        for config in ("2gpu", "ray"):
            other = worst(config, metric)
            if base is None or other is None:
                continue
            out[f"noise_{metric}_{config}_worst_gpu_vs_1gpu"] = [other, base]
            lines.append(f"profile noise {name} of the candidate's medians, worst GPU of {config}: {_pct(other)} "
                         f"against 1gpu {_pct(base)}: "
                         + ("n/a" if meaningless else ("no worse" if other <= base else "WORSE")))
    return out, lines


def _steady(steady: dict | None) -> str:
    return "-" if not steady else f"{steady['per_min']} ({steady['completions']}, {steady['from_s']}-{steady['to_s']} s)"


def _table(report: dict) -> str:
    head = ("| config | GPUs the server saw | warm-up s | wall s | candidates done / pushed | good | candidates/min | "
            "vs 1gpu | steady/min (between) | failures | one result each |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    base = (report["configs"].get("1gpu") or {}).get("candidates_per_min")
    for name, row in report["configs"].items():
        if row.get("error"):
            lines.append(f"| {name} | {' '.join(row['error'].split())[:200]} |" + " |" * 9)
            continue
        seen = ", ".join(f"{g['index']} {g['name']}" for g in row.get("server_gpus", [])) or "none"
        if name == "ray":
            seen = f"nodes: {row.get('ray_cluster', {}).get('summary', '?')}"
        ratio = f"{row['candidates_per_min'] / base:.2f}x" if base and row.get("candidates_per_min") else "-"
        lines.append(f"| {name} | {seen} | {row.get('warmup', {}).get('wall_s', '-')} | {row['wall_s']} | "
                     f"{row['candidates_completed']} / {row['candidates_pushed']} | {row['candidates_good']} | "
                     f"{row['candidates_per_min']} | {ratio} | {_steady(row.get('steady'))} | {row['failures_count']} | "
                     f"{_one_each(row)} |")
    gpu_head = ("| config | GPU | jobs compile / verify / profile | candidate median us | (max-min)/median | "
                "IQR/median | within-profile IQR/median | eager median us (spread) |")
    lines += ["", gpu_head, "|" + "---|" * (gpu_head.count("|") - 1)]
    for name, row in report["configs"].items():
        for g in (row.get("gpus") or {}).values():
            c, e = g["candidate_profile"], g["eager_profile"]
            nodes = f" [Ray nodes {', '.join(f'{k[:8]}: {v}' for k, v in g['ray_nodes'].items())}]" \
                if g.get("ray_nodes") else ""
            lines.append(f"| {name} | {g['label']}{nodes} | {' / '.join(str(g['jobs'][t]) for t in TOOLS)} | "
                         f"{c.get('median_us', '-')} (n={c.get('n')}) | {_pct(c.get('range_over_median'))} | "
                         f"{_pct(c.get('iqr_over_median'))} | {_pct(g['within_profile_iqr_over_median'])} | "
                         f"{e.get('median_us', '-')} ({_pct(e.get('range_over_median'))}) |")
    load_head = ("| config | host CPUs busy, mean / p90 | server process, cores mean / p90 | server + workers (ray: and "
                 "the cluster's processes), cores mean / p90 | their processes (max) / threads (max) | top ops in the "
                 "window: n x p50 s (total s) |")
    lines += ["", load_head, "|" + "---|" * (load_head.count("|") - 1)]
    for name, row in report["configs"].items():
        h = row.get("host_load") or {}
        if not h.get("samples"):
            continue
        ops = "; ".join(f"{k} {v['n']}x{v['p50_s']} ({v['total_s']})" for k, v in list((row.get("ops") or {}).items())[:6])
        lines.append(f"| {name} | {h['host_busy']['mean']:.0%} / {h['host_busy']['p90']:.0%} | "
                     f"{h['server_cores']['mean']:.2f} / {h['server_cores']['p90']:.2f} | "
                     f"{h['kforge_cores']['mean']:.1f} / {h['kforge_cores']['p90']:.1f} | "
                     f"{h['kforge_processes']['max']:.0f} / {h['kforge_threads']['max']:.0f} | {ops} |")
    return "\n".join(lines)


def _write(report: dict, args: argparse.Namespace) -> Path:
    report["comparison"], summary = _compare(report)
    table = _table(report)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"gpu-throughput-{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    run = report["run"]
    gpus = "; ".join(f"{g.get('index')}: {g.get('name')} ({g.get('uuid', '')[:16]}, {g.get('memory.total', '?')}, "
                     f"bus {g.get('pci.bus_id', '?')})" for g in run["host_gpus"]) or "none listed"
    details = []
    for name, row in report["configs"].items():
        if row.get("error"):
            details.append(f"- **{name}**: {row['error']}")
            continue
        one = row["exactly_one_result"]
        details.append(
            f"- **{name}**: the server's backend: {row['backend_info'].get('device_name')}, "
            f"{row['backend_info'].get('versions')}; client latency p50 {row['latency_p50_s']}; server queue wait p50 "
            f"{row['server_queue_wait_p50_s']}; service p50 {row['server_service_p50_s']}; devices in the job store "
            f"{row['devices_in_store']}; submissions {one['submissions']}, results {one['results']}, distinct job ids "
            f"{one['distinct_job_ids']}/{one['job_handles']}, busy retries {one['busy_retries']}"
            + (f"; timed out at {args.config_timeout_s:g} s, cancelled {len(row.get('cancelled_at_timeout', []))}"
               if row.get("timed_out") else "")
            + (f"; Ray cluster {row['ray_cluster']}" if row.get("ray_cluster") else ""))
        details += [f"  - failure: {f}" for f in row["failures"][:20]]
        details += [f"  - {u}" for u in row["untrusted_speedups"][:10]]
        details += [f"  - {c}" for c in row.get("timing_checks", [])[:12]]
        if row.get("warmup", {}).get("errors"):
            details += [f"  - warm-up error: {e}" for e in row["warmup"]["errors"]]
    md = (f"# GPU throughput: 1 GPU against 2 GPUs{' and a Ray fleet' if 'ray' in report['configs'] else ''}\n\n"
          f"{run['date']}, host {run['host']} ({run['cores']} cores); GPUs: {gpus}; driver {run['driver']}; "
          f"versions: {', '.join(f'{k} {v}' for k, v in run['versions'].items())}\n\n"
          f"Backend `{run['backend']}`, problem `{run['problem']}`, candidate `{run['candidate']}`; "
          f"{run['clients']} clients x {run['candidates']} candidates, "
          f"{run.get('in_flight') or 'all'} in flight per client, each compile -> verify "
          f"({run['trials']} trials) -> profile (baselines {run['baselines']}, budget "
          f"{run['budget_s'] or 'server default'}, no hardware counters); warm-up {run['warmup']} candidate(s) per "
          f"device before the clock.\n\n"
          + "".join(f"**Note:** {n}\n\n" for n in run["notes"])
          + f"{table}\n\n" + "\n".join(f"- {s}" for s in summary) + "\n\n" + "\n".join(details) + "\n")
    stem.with_suffix(".md").write_text(md)
    return stem


# ---------------------------------------------------------------------------------------------------------------
def _run_config(name: str, args: argparse.Namespace, gpu_ids: list[str], smi: dict[str, dict[str, str]],
                candidate: str) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"kforge-gputp-{name}-"))
    env = _server_env(home, args)
    extra: list[str] = []
    cluster = ray_tmp = None
    row: dict[str, Any] = {"data_dir": str(home)}
    if args.backend != "cpu":
        ids = {"1gpu": gpu_ids[:1], "2gpu": gpu_ids[:2], "ray": gpu_ids[:2]}[name]
        if name != "ray" and ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
        row["cuda_visible_devices"] = ",".join(ids) if name != "ray" else None
    ray_nodes = 0
    if name == "ray":
        ray_tmp = Path(tempfile.mkdtemp(prefix="kfray-"))  # short: Ray's socket paths must stay short
        try:
            cluster, layout = _start_ray(gpu_ids if args.backend != "cpu" else [], os.cpu_count() or 2, ray_tmp)
        except Exception as exc:  # noqa: BLE001 - said in the results; the other configurations stand
            return {**row, "error": f"could not start a local Ray cluster: {type(exc).__name__}: {exc}"[:500]}
        layout["summary"] = (f"head {len(layout['head']['gpus'])} GPU + worker {len(layout['worker']['gpus'])} GPU"
                             f", {layout['head']['cpus']} CPUs each")
        row["ray_cluster"] = layout
        ray_nodes = 2
        extra = ["--ray", cluster.address]
        env["KFORGE_RAY_NODE_HOME"] = str(home / "ray-nodes")
    try:
        port = _free_port()
        print(f"[{name}] starting the server (data directory {home})", flush=True)
        server = _start_server(home, port, env, extra)
        try:
            drive = anyio.run(_drive, args, f"http://127.0.0.1:{port}/mcp", name, candidate, ray_nodes, server.pid,
                              [home / "trace.jsonl", home / "ray-nodes" / "trace.jsonl"])
        finally:
            _stop(server)
    except Exception as exc:  # noqa: BLE001 - said in the results; the other configurations stand
        return {**row, "error": f"{type(exc).__name__}: {exc}"[:800], "server_log_tail": _tail(home / "server.log")}
    finally:
        if cluster is not None:
            cluster.shutdown()  # its own processes only
        if ray_tmp is not None and not args.keep_data:
            shutil.rmtree(ray_tmp, ignore_errors=True)
    row.update(drive)
    if row.get("error"):
        row["server_log_tail"] = _tail(home / "server.log")
        return row
    row = _summarize(name, row, _store_rows(home), smi, args)
    if not args.keep_data and not row["failures"] and row["exactly_one_result"]["ok"]:
        shutil.rmtree(home, ignore_errors=True)
        row["data_dir"] += " (removed)"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4, help="concurrent MCP clients (default 4)")
    ap.add_argument("--candidates", type=int, default=5, help="candidates per client (default 5)")
    ap.add_argument("--in-flight", type=int, help="candidates each client has in flight at once, the next one "
                    "started as one ends (default: all of them at once, a burst)")
    ap.add_argument("--backend", default="cuda", help="cuda (default), triton, cpu")
    ap.add_argument("--problem", default="relu", help="a problem of the pack (default relu)")
    ap.add_argument("--candidate", type=Path, help="candidate file (default: tests/candidates/relu_python.py, no "
                    "build, for --problem; with --reference, the reference with Model renamed ModelNew)")
    ap.add_argument("--reference", type=Path, help="a reference file instead of the pack's --problem, e.g. a "
                    "KernelBench problem at its published size: a candidate whose time is the device's, not the "
                    "host's launch path (the default ReLU's 8 us)")
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, help="which configurations, in order "
                    "(default 1gpu 2gpu, and ray with --ray)")
    ap.add_argument("--ray", action="store_true", help="also the ray configuration")
    ap.add_argument("--baselines", nargs="+", default=["eager"], choices=["eager", "torch.compile"],
                    help="profile_kernel's baselines (default eager: torch.compile's build is not what is measured)")
    ap.add_argument("--keep-traces", action="store_true", help="also write each window's trace lines "
                    "(gpu-throughput-TAG-CONFIG-trace.jsonl.gz in --out)")
    ap.add_argument("--trials", type=int, default=5, help="verify trials (default 5, the tool's default)")
    ap.add_argument("--budget-s", type=float, help="profile budget per timed model (default: the server's)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up candidates per device before the clock (default 1)")
    ap.add_argument("--config-timeout-s", type=float, default=200,
                    help="stop a configuration's measured window after this long (its warm-up after half of it); "
                         "what is unfinished is cancelled and counted as failed (default 200)")
    ap.add_argument("--parallel", type=int, help="KFORGE_PARALLEL_JOBS for the servers (default: theirs)")
    ap.add_argument("--server-env", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra environment for every configuration's server (e.g. KFORGE_MAX_FORKS=4)")
    ap.add_argument("--allow-partial-sandbox", action="store_true", help="serve where the host refuses part of the "
                    "workers' sandbox (KFORGE_ALLOW_PARTIAL_SANDBOX=1)")
    ap.add_argument("--keep-data", action="store_true", help="keep each configuration's data directory")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--tag", help="file name tag (default <backend>-<gpu model>x<n>-<date>)")
    args = ap.parse_args()
    configs = args.configs or (["1gpu", "2gpu"] + (["ray"] if args.ray else []))
    if args.candidate is None and args.reference is None:
        args.candidate = REPO / "tests" / "candidates" / "relu_python.py"
    # The reference itself as the candidate, as bench/kernelbench_sample.py makes one (`as_candidate`).
    candidate = args.candidate.read_text() if args.candidate else as_candidate(args.reference.read_text())
    args.reference_code = args.reference.read_text() if args.reference else None

    gpu_ids, host_gpus, found_how = _visible_gpus(args.backend)
    smi_rows = _nvidia_smi()
    smi = {r["uuid"]: r for r in smi_rows if r.get("uuid")}
    date = time.strftime("%Y-%m-%d")
    model = re.sub(r"[^a-z0-9]+", "-", (host_gpus[0]["name"] if gpu_ids and host_gpus else "cpu").lower()).strip("-")
    model = model.removeprefix("nvidia-")
    args.tag = args.tag or (f"cpu-{date}" if args.backend == "cpu" else f"{args.backend}-{model}x{len(gpu_ids)}-{date}")
    notes, ratio_note = [], ""
    if args.backend == "cpu":
        ratio_note = "cpu backend: no configuration has a GPU, the ratios mean nothing here"
        notes.append(f"{ratio_note}; this run checks the plumbing only (1gpu and 2gpu are the same CPU server).")
    elif len(gpu_ids) == 0:
        ratio_note = "no GPU found: the ratios mean nothing"
        notes.append(f"no GPU was found ({found_how}): every configuration is the same; plumbing only.")
    elif len(gpu_ids) == 1:
        ratio_note = "one GPU: 2gpu is 1gpu, the ratio means nothing"
        notes.append("this host has one GPU: 2gpu sees the same single GPU as 1gpu (a dry run of the plumbing), and "
                     "the Ray worker node has no GPU.")
    if len(gpu_ids) > 2:
        notes.append(f"{len(gpu_ids)} GPUs visible: 1gpu uses the first, 2gpu and ray the first two.")
    if "ray" in configs and args.backend == "cpu":
        notes.append(f"ray on the cpu backend: head and worker node with {max(1, (os.cpu_count() or 2) // 2)} CPU(s) "
                     "each, no GPU.")
    report: dict[str, Any] = {"run": {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(), "cores": os.cpu_count(),
        "backend": args.backend, "problem": str(args.reference) if args.reference else args.problem,
        "candidate": "the reference, Model renamed ModelNew" if args.candidate is None else
        str(args.candidate.resolve().relative_to(REPO)) if args.candidate.resolve().is_relative_to(REPO)
        else str(args.candidate),
        "clients": args.clients, "candidates": args.candidates, "in_flight": args.in_flight, "trials": args.trials, "baselines": args.baselines,
        "budget_s": args.budget_s, "warmup": args.warmup, "config_timeout_s": args.config_timeout_s,
        "parallel": args.parallel or "server default", "server_env": args.server_env, "configs": configs,
        "host_gpus": host_gpus if args.backend != "cpu" else smi_rows, "gpus_found": found_how,
        "gpu_ids": gpu_ids, "driver": (smi_rows[0]["driver_version"] if smi_rows else "none (no nvidia-smi)"),
        "versions": _versions(), "notes": notes, "ratio_note": ratio_note,
    }, "configs": {}}
    print(f"gpu throughput: backend {args.backend}, configs {configs}, GPUs {gpu_ids or 'none'} ({found_how}); "
          f"{args.clients} clients x {args.candidates} candidates", flush=True)
    for name in configs:
        t0 = time.monotonic()
        row = _run_config(name, args, gpu_ids, smi, candidate)
        row["config_total_s"] = round(time.monotonic() - t0, 1)
        report["configs"][name] = row
        stem = _write(report, args)  # after each configuration: an interrupted run keeps what ran
        msg = row.get("error") or (f"{row['candidates_completed']}/{row['candidates_pushed']} candidates in "
                                   f"{row['wall_s']} s: {row['candidates_per_min']}/min, {row['failures_count']} "
                                   "failure(s)")
        print(f"[{name}] {msg} ({row['config_total_s']} s with start and warm-up)", flush=True)
    print()
    print(_table(report))
    for n in notes:
        print(f"note: {n}")
    for line in _compare(report)[1]:
        print(line)
    for name, row in report["configs"].items():
        for f in row.get("failures", [])[:10]:
            print(f"[{name}] failure: {f}")
        if row.get("error") and row.get("server_log_tail"):
            print(f"[{name}] server log tail:\n{row['server_log_tail']}")
    print(f"wrote {stem}.json and .md")
    bad = [n for n, r in report["configs"].items() if r.get("error") or r.get("failures")
           or not r.get("exactly_one_result", {}).get("ok")]
    if bad:
        raise SystemExit(f"FAILED in {', '.join(bad)}: see the failures above and the JSON")


if __name__ == "__main__":
    main()
