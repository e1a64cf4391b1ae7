"""ATTACK: pass a note between jobs through the directories a worker's private /dev/shm still shares with the
host (the CPU output hand-off root, /dev/shm/kforge-handoff-*, is bound into every worker): in MODE "write"
job A leaves kforge-note-__NOTE__ in each of them; in MODE "read" job B (a later call) looks there.
MUST: job B finds no note: what one job leaves must not reach the next (hand-off space per job, or none
writable across jobs); the test also cleans up and reports what reached the host."""
import errno
import glob
import json
import os

MODE = "__MODE__"
report = {}
for d in sorted(glob.glob("/dev/shm/kforge-handoff-*"))[:8]:
    if not os.path.isdir(d):
        continue
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
