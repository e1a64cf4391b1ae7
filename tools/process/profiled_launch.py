"""`python -m kforge.tools.process.profiled_launch CONFINEMENT -- PROFILER ... python -m kforge.tools.harness.worker`:
a rerun profiler's front-end and the worker it profiles in one sandbox of their own (Nsight Compute's, `ncu`).

Process plumbing, so it lives with the sandbox it enters (`kforge.profilers.ncu` builds ncu's command and reads its
report, and imports nothing of the tools). It runs as `kforge.tools.process.sandbox`'s own main runs a command, but
sends the sandbox's report first on fd 0, the worker's protocol socket, before any candidate code runs: the worker
enters no sandbox itself, only Landlock, which it reports. One sandbox, not one each: the front-end finds its target
by pid, talks to it through an abstract Unix socket (`@nv_target_process_<pid>`, per network namespace) and FIFOs in
/tmp, and ncu's launcher (TreeLauncherSubreaper) sits between them.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import replace

from .sandbox import Confinement, enter, network_state, with_gpu_nodes

__all__ = ["main"]


def main(argv: list[str]) -> None:
    split = argv.index("--")
    # Its GPU pin's nodes, as a worker picks its own; the worker reports a pin it could not match.
    # (An index pin becomes UUIDs here, which ncu and its target inherit: they see only the pinned GPUs' nodes.)
    conf = with_gpu_nodes(Confinement.from_arg(argv[split - 1]), None)[0]
    # Landlock is the worker's own to apply (`--landlock`, `Confinement.landlock_later`): a rule this process made
    # for /proc/self/task would be its own, and the worker's CUDA start writes its own threads' names there.
    report = enter(replace(conf, landlock_later=True))  # returns in the namespace's PID 1, which ncu becomes
    line = json.dumps({"sandbox": {"applied": report["applied"], "missing": report["missing"],
                                   "network": network_state(report)}})
    with socket.socket(fileno=os.dup(0)) as channel:
        channel.sendall((line + "\n").encode())
    os.execvp(argv[split + 1], argv[split + 1:])


if __name__ == "__main__":
    main(sys.argv[1:])
