"""Is a Ray node's slow torch.profiler step the agent's or Ray's? (issue 21, session 19)

On the 2-core VM, `gpu_throughput.py --backend cpu --configs 1gpu ray` read the candidate's `profile` op at a p50 of
10.6 s on the Ray nodes against 0.62 s on the plain server (the nodes' traces, `NodeConfig.trace`). This runs the same
profile jobs through a `NodeAgent` in a plain process, without Ray, with the agent's OpenMP threads as given (or as
inherited), and prints each job's wall time and the traced `profile` ops.

    python3 bench/explore/agent_profile_step.py [--threads N] [--backend cpu] [--home DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from kforge.server.catalog import problem_reference
from kforge.tools.fleet_node import NodeAgent, NodeConfig
from kforge.tools.process.limits import WorkerLimits

REPO = Path(__file__).resolve().parents[2]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--home", type=Path, default=Path(tempfile.mkdtemp(prefix="kf-agent-")))
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    code = (REPO / "tests" / "candidates" / "relu_python.py").read_text()
    agent = NodeAgent(NodeConfig(limits=WorkerLimits(), home=str(args.home), slots=1, threads=args.threads,
                                 trace=True, warm_workers=1), cpus=1)
    for i in range(args.jobs):
        request = {"tool": "profile_kernel", "backend": args.backend, "candidate_code": f"{code}\n# {i}\n",
                   "reference_code": problem_reference("relu"), "use_store": False, "hardware_counters": False,
                   "baselines": ["eager"]}
        started = time.perf_counter()
        async for _ in agent.run_job(request):
            pass
        print(f"job {i}: {time.perf_counter() - started:.2f} s", flush=True)
    await agent.stop()
    for line in (args.home / "trace.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["op"] == "profile":
            print(f"  {event['role']}.profile {event['s']:.3f} s")


if __name__ == "__main__":
    asyncio.run(main())
