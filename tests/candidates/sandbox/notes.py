"""ATTACK: pass notes from one job to the next through shared memory and temporary files: in MODE "write"
job A leaves /dev/shm/kforge-note-__NOTE__ and /tmp/kforge-note-__NOTE__; in MODE "read" job B (a later call,
another worker) looks for them.
MUST: job B finds neither, and neither is on the host afterwards (each worker has a private tmpfs on /tmp and
/dev/shm); the test looks at the host's."""
import errno
import json
import os

MODE = "__MODE__"
report = {}
for d in ("/dev/shm", "/tmp"):
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
