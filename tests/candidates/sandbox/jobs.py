"""ATTACK: write beside its own job in the data directory's jobs/ (every job's scratch lives there): a file in
jobs/ itself and a planted directory jobs/kforge-write-__MARKER__-job/; also count the other jobs' directories
and files it can read there.
MUST: both creates fail: a worker writes only in its own scratch (and the cache and its private tmp); the
test also looks for them on the host; no other job's directory is seen."""
import errno
import json
import os
from pathlib import Path

cwd = Path.cwd()  # <home>/jobs/<job>/<role>
jobs = next((p for p in (cwd, *cwd.parents) if p.name == "jobs"), None)
report = {"jobs": str(jobs)}
if jobs is None:
    report["file_in_jobs"] = report["planted_job"] = f"not tried (no jobs/ above {cwd})"
else:
    own = next(p for p in (cwd, *cwd.parents) if p.parent == jobs)
    try:
        fd = os.open(jobs / "kforge-write-__MARKER__-file", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        report["file_in_jobs"] = "SUCCEEDED: created"
    except OSError as exc:
        report["file_in_jobs"] = f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"
    try:
        os.mkdir(jobs / "kforge-write-__MARKER__-job")
        report["planted_job"] = "SUCCEEDED: created"
    except OSError as exc:
        report["planted_job"] = f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"
    others, readable = [], []
    try:
        others = [p for p in jobs.iterdir() if p != own and not p.name.startswith("kforge-write-")]
        for d in others:
            for f in d.rglob("*.py"):
                try:
                    f.read_bytes()
                    readable.append(str(f.relative_to(jobs)))
                except OSError:
                    pass
    except OSError as exc:
        report["listing"] = f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"
    report["other_jobs_seen"] = len(others)
    report["their_files_read"] = readable[:5]
raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps(report))
