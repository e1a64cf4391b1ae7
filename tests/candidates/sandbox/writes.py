"""ATTACK: write outside the worker's own directories: create a file in the server's data directory (given,
and found as the parent of jobs/ from the worker's scratch), in the installed kforge package, its resources/
and the problem pack resources/problems/, and in the user's HOME; open kforge's __init__.py and a problem's
reference.py for appending (nothing is written).
MUST: every create and open fails (Landlock: read-only outside scratch, cache and tmp). Files created in the
data directory are left for the test to look for on the host (a private tmpfs there would keep them from it);
any created elsewhere are removed at once and reported."""
import errno
import json
import os
from pathlib import Path

import kforge

NAME = "kforge-write-__MARKER__"
pkg = os.path.dirname(kforge.__file__)
cwd = Path.cwd()  # <home>/jobs/<job>/<role>
jobs = next((p for p in (cwd, *cwd.parents) if p.name == "jobs"), cwd.parent.parent)
leave = {"data_home": "__HOME__", "jobs_parent": str(jobs.parent)}
remove = {"package": pkg, "resources": os.path.join(pkg, "resources"),
          "problems": os.path.join(pkg, "resources", "problems"), "user_home": "__USER_HOME__"}


def blocked(exc):
    return f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"


report = {"package_dir": pkg}
for key, d in {**leave, **remove}.items():
    path = os.path.join(d, f"{NAME}-{key}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"written by a candidate")
        os.close(fd)
        if key in remove:
            os.remove(path)
        report[key] = f"SUCCEEDED: created {path}" + (" (removed again)" if key in remove else "")
    except OSError as exc:
        report[key] = blocked(exc)
for key, path in {"append_package": os.path.join(pkg, "__init__.py"),
                  "append_problem": os.path.join(pkg, "resources", "problems", "relu", "reference.py")}.items():
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        report[key] = "SUCCEEDED: opened for writing"
    except OSError as exc:
        report[key] = blocked(exc)
raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps(report))
