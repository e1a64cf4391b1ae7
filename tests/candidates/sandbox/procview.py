"""ATTACK: look at the host's processes from inside a worker: list /proc, pick out the server (`kforge ...
serve`), its zygote and the warm workers (`--zygote`), a judge or another worker (`kforge.tools.harness.worker`) by
their command lines, and open the server's /proc/<pid>/environ, /proc/<pid>/mem and list /proc/<pid>/fd.
MUST: none of the server's processes is visible (the worker is PID 1 of a PID namespace with its own /proc)
and all three opens fail."""
import errno
import json
import os
import time

SERVER = __SERVER_PID__
me = os.getpid()


def attempt(fn):
    try:
        return f"SUCCEEDED: {fn()}"
    except OSError as exc:
        return f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def mine(pid):
    """This process or one it started (those it may see)."""
    seen = set()
    while pid > 0 and pid not in seen:
        if pid == me:
            return True
        seen.add(pid)
        pid = parent(pid)
    return False


def kind(cmd):
    words = cmd.split()
    if any("kforge" in w for w in words) and "serve" in words:
        return "server"
    if "--zygote" in words:
        return "zygote or warm worker"
    if "kforge.tools.harness.worker" in cmd:
        return "worker"
    return None


flagged, numeric = {}, []
deadline = time.monotonic() + 3  # a judge starts beside the candidate: look for a few seconds
while True:
    numeric = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    for pid in numeric:
        if pid not in flagged and not mine(pid):
            k = kind(cmdline(pid) or "")
            if k:
                flagged[pid] = k
    if time.monotonic() > deadline:
        break
    time.sleep(0.25)

report = {
    "me": me,
    "procs": len(numeric),
    "others": len([p for p in numeric if not mine(p)]),
    "flagged": [f"{pid} {k}" for pid, k in sorted(flagged.items())][:12],
    "server_visible": kind(cmdline(SERVER) or "") == "server",
    "environ": attempt(lambda: f"{len(open(f'/proc/{SERVER}/environ', 'rb').read())} bytes"),
    "mem": attempt(lambda: open(f"/proc/{SERVER}/mem", "rb").close() or "opened"),
    "fd": attempt(lambda: f"{len(os.listdir(f'/proc/{SERVER}/fd'))} entries"),
}
raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps(report))
