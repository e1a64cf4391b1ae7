"""ATTACK: leave processes behind the job: `sleep __SLEEP__` in a session of its own (subprocess,
start_new_session) and again double-forked after setsid (reparented away from the worker), then fail the job.
MUST: neither sleeper outlives the job (the worker is PID 1 of its PID namespace: when it ends, the kernel
kills every process in it); the test looks for them in the host's /proc."""
import json
import os
import subprocess

ARG = "__SLEEP__"
report = {}
try:
    p = subprocess.Popen(["sleep", ARG], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report["new_session"] = f"started pid {p.pid}"
except OSError as exc:
    report["new_session"] = f"not started: {exc}"
try:
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execvp("sleep", ["sleep", ARG])
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    report["double_fork"] = "started"
except OSError as exc:
    report["double_fork"] = f"not started: {exc}"
raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps(report))
