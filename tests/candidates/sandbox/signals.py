"""ATTACK: SIGKILL the worker's parent, the server's zygote and the server itself (their pids are given; the
worker's own group (pid 0), everyone (-1) and pid 1 are left alone, as they are the host's own outside a sandbox).
MUST: every kill fails (they are outside the worker's PID namespace) and the server keeps serving."""
import errno
import json
import os
import signal

targets = {"parent": os.getppid(), "zygote": __ZYGOTE_PID__, "server": __SERVER_PID__}
report, tried = {}, {}
for name, pid in targets.items():
    if pid <= 1 or pid == os.getpid():
        report[name] = f"not tried (pid {pid})"
    elif pid in tried:
        report[name] = f"not tried (pid {pid} is the {tried[pid]})"
    else:
        tried[pid] = name
        try:
            os.kill(pid, signal.SIGKILL)
            report[name] = f"SUCCEEDED: pid {pid} killed"
        except OSError as exc:
            report[name] = f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"
raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps(report))
