"""ATTACK: pass notes from one job to the next through shared places: in MODE "write" job A leaves
kforge-note-__NOTE__ in each directory of __DIRS__; in MODE "read" job B (a later call, another worker) looks
for them there. The directories: /dev/shm and /tmp (each worker has a private tmpfs on both), or the data directory's (itself,
jobs/, and the cache, which workers still share).
MUST: job B finds no note, and none is on the host afterwards; the test looks at the host's and cleans up."""
import errno
import glob  # noqa: F401 - __DIRS__ may glob
import json
import os

MODE = "__MODE__"
report = {}
for d in __DIRS__:
    path = os.path.join(d, "kforge-note-__NOTE__")
    try:
        if MODE == "write":
            with open(path, "w") as f:
                f.write("note __NOTE__")
            report[d] = "written"
        else:
            with open(path) as f:
                report[d] = f"SUCCEEDED: read {f.read()[:40]!r}"
    except FileNotFoundError:
        report[d] = "absent"
    except OSError as exc:
        report[d] = f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"
raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps(report))
