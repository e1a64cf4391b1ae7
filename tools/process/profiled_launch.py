"""`python -m kforge.tools.process.profiled_launch CONFINEMENT -- PROFILER ... python -m kforge.tools.harness.worker`:
a rerun profiler's front-end and the worker it profiles in one sandbox of their own (Nsight Compute's, `ncu`).

Process plumbing, so it lives with the sandbox it enters (`kforge.profilers.ncu` builds ncu's command and reads its
report, and imports nothing of the tools). It runs as `kforge.tools.process.sandbox`'s own main runs a command, but
sends the sandbox's report first on fd 0, the worker's protocol socket, before any candidate code runs: the worker
enters no sandbox itself, only Landlock, which it reports. One sandbox, not one each: the front-end finds its target
by pid, talks to it through an abstract Unix socket (`@nv_target_process_<pid>`, per network namespace) and FIFOs in
/tmp, and ncu's launcher (TreeLauncherSubreaper) sits between them.

Landlock twice: this process applies a domain of its own before it execs ncu, so that ncu, its target and every
thread in them, ncu's injected thread included (it starts in the worker before Python's main, where the worker's
own Landlock cannot reach it), are inside one; the worker then adds its own, stricter on /proc, on its threads.
The injected thread is told to the worker (`PROFILER_LANDLOCK_ENV`), which reports it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import replace

from .sandbox import Confinement, apply_landlock, enter, network_state, with_gpu_nodes

__all__ = ["PROFILER_LANDLOCK_ENV", "main"]

#: Set (to "1") in the profiler's environment, which its target inherits, once the profiler's own Landlock domain holds.
PROFILER_LANDLOCK_ENV = "KFORGE_PROFILER_LANDLOCK"


def main(argv: list[str]) -> None:
    split = argv.index("--")
    # Its GPU pin's nodes, as a worker picks its own; the worker reports a pin it could not match.
    # (An index pin becomes UUIDs here, which ncu and its target inherit: they see only the pinned GPUs' nodes.)
    conf = with_gpu_nodes(Confinement.from_arg(argv[split - 1]), None)[0]
    # The worker's stricter Landlock is its own to apply (`--landlock`, `Confinement.landlock_later`): a rule this
    # process made for /proc/self/task would be its own, and the worker's CUDA start writes its own threads' names
    # there. This process's domain below leaves the namespace's whole /proc writable instead.
    report = enter(replace(conf, landlock_later=True))  # returns in the namespace's PID 1, which ncu becomes
    # After the mounts (the rule on /proc binds the namespace's own), single-threaded, before the exec.
    outer = apply_landlock(conf, proc_writable=True)
    report["missing"] += outer["missing"]
    if not outer["missing"]:
        report["applied"].append("landlock on the profiler and every thread of its target (ncu's injection too)")
        os.environ[PROFILER_LANDLOCK_ENV] = "1"
    line = json.dumps({"sandbox": {"applied": report["applied"], "missing": report["missing"],
                                   "network": network_state(report)}})
    with socket.socket(fileno=os.dup(0)) as channel:
        channel.sendall((line + "\n").encode())
    os.execvp(argv[split + 1], argv[split + 1:])


if __name__ == "__main__":
    main(sys.argv[1:])
