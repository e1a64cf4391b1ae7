"""ATTACK: find the server's result store, `kforge.db`, by walking up from the worker's directory (scratch is
`<home>/jobs/<job>/`) and at the data directory's path, then open it for reading and for writing, plainly and
with sqlite3 (a write lock is taken and rolled back: nothing is changed).
MUST: the store is not found, or every open is refused (the data directory is hidden except jobs/ and cache/)."""
import errno
import json
import os
import sqlite3
from pathlib import Path

HOME = Path("__HOME__")


def attempt(fn):
    try:
        return f"SUCCEEDED: {fn()}"
    except OSError as exc:
        return f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"
    except sqlite3.Error as exc:
        text = str(exc)
        refused = any(s in text for s in ("unable to open", "readonly", "read-only", "not authorized", "disk I/O"))
        return f"{'blocked' if refused else 'SUCCEEDED (opened)'}: {text[:60]}"


def sql_read(path):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2)
    try:
        return f"{con.execute('select count(*) from sqlite_master').fetchone()[0]} schema rows"
    finally:
        con.close()


def sql_write(path):
    con = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=2, isolation_level=None)
    try:
        con.execute("begin immediate")  # the write lock: proves the file is writable
        con.execute("rollback")
        return "write lock taken"
    finally:
        con.close()


found = []
cwd = Path.cwd()
for d in (cwd, *cwd.parents, HOME):
    p = d / "kforge.db"
    if p not in found and os.path.exists(p):
        found.append(p)
report = {"cwd": str(cwd), "found": [str(p) for p in found], "home_lists": attempt(lambda: sorted(os.listdir(HOME))[:8])}
for i, p in enumerate(found[:3]):
    report[f"db{i}"] = {
        "read": attempt(lambda: f"{len(open(p, 'rb').read(16))} bytes"),
        "write": attempt(lambda: open(p, "r+b").close() or "opened r+b"),
        "sqlite_read": attempt(lambda: sql_read(p)),
        "sqlite_write": attempt(lambda: sql_write(p)),
    }
raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps(report))
