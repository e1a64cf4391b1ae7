"""The result store: SQLite for results and profiles, files for their artifacts.

Layout under the data directory (``KFORGE_HOME``)::

    kforge.db                    results (keyed by JobSpec.key), profiles (keyed by profile_id), the
                                 history of candidates per problem (keyed by the reference's sha256) and
                                 jobs (keyed by job_id: request, status, progress, result)
    artifacts/<profile_id>/      raw artifacts of a profile (Chrome trace, worker logs)
    cache/                       build caches (C++ extensions, inductor, triton)
    jobs/                        scratch directories of running jobs (removed when a job ends)

Only answers that depend on nothing but the code and the inputs are kept and served again
(`kforge.tools.verdict.why_not_stored`: no timeouts, crashes, failures of the reference or failed
environment checks); a served answer carries `stored_at`, when it was stored.

Each thread of a server process keeps one connection (a thread of `anyio.to_thread` draws charts from the
store), and several server processes may share the file: WAL mode lets readers proceed while one writer commits.
A connection per operation cost ~5 ms each on a 2-core VM, most of it the checkpoint that closing the last
connection of a WAL database runs, and a job writes its progress a dozen times, on the server's event loop.
`synchronous=NORMAL`: in WAL mode a commit is then safe against a crash of the server (never a corrupt file);
only a power cut may lose the last commits, and a job whose finish is lost is resumed by the next server.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from .verdict import why_not_stored

__all__ = ["ACTIVE_JOB_STATUSES", "ResultStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY, tool TEXT NOT NULL, created_at REAL NOT NULL, result TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS profiles (
    id TEXT PRIMARY KEY, key TEXT NOT NULL, backend TEXT NOT NULL, created_at REAL NOT NULL, result TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS profiles_by_time ON profiles (created_at);
CREATE TABLE IF NOT EXISTS history (
    reference_sha256 TEXT NOT NULL, backend TEXT NOT NULL, candidate_sha256 TEXT NOT NULL, tool TEXT NOT NULL,
    created_at REAL NOT NULL, correct INTEGER, speedup_eager REAL, speedup_compile REAL, median_us REAL,
    trusted INTEGER, profile_id TEXT);
CREATE INDEX IF NOT EXISTS history_by_problem ON history (reference_sha256, created_at);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, key TEXT NOT NULL, tool TEXT NOT NULL, backend TEXT NOT NULL, client TEXT NOT NULL,
    device TEXT NOT NULL, owner TEXT NOT NULL, status TEXT NOT NULL, request TEXT NOT NULL, created_at REAL NOT NULL,
    started_at REAL, finished_at REAL, done REAL, total REAL, message TEXT, result TEXT, error TEXT,
    crashes INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, created_at);
"""
# A problem's history keeps this many of its latest entries in a read.
_HISTORY_LIMIT = 200
# Columns a job's update may set (the rest are fixed at submission).
_JOB_UPDATABLE = {"owner", "status", "started_at", "finished_at", "done", "total", "message", "result", "error",
                  "crashes"}
_JOB_JSON = ("request", "result")
# A job in one of these has not finished: it is kept, and a server resumes it.
ACTIVE_JOB_STATUSES = ("queued", "running")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ResultStore:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.home.mkdir(parents=True, exist_ok=True)
        self.path = home / "kforge.db"
        self._local = threading.local()
        with self._db() as db:
            db.executescript(_SCHEMA)
            if "crashes" not in {row[1] for row in db.execute("PRAGMA table_info(jobs)")}:  # a store from before it
                db.execute("ALTER TABLE jobs ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0")

    def _db(self) -> sqlite3.Connection:
        """This thread's connection (a forked child opens its own: SQLite's may not cross a fork). `with` it is one
        transaction: committed on success, rolled back on an exception."""
        db = getattr(self._local, "db", None)
        if db is None or self._local.pid != os.getpid():
            db = sqlite3.connect(self.path, timeout=30)
            db.row_factory = sqlite3.Row  # rows read by index and by name alike
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db, self._local.pid = db, os.getpid()
        return db

    def close(self) -> None:
        """Close this thread's connection (the others close with their threads' ends)."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # -- results ---------------------------------------------------------------------------------
    def get_result(self, key: str) -> dict[str, Any] | None:
        """The stored answer for `key`, with `stored_at` (Unix time); None when there is none to serve.

        An answer the rule would not keep (stored before it, or by an older rule) is dropped, not served.
        """
        with self._db() as db:
            row = db.execute("SELECT result, created_at FROM results WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        result = json.loads(row[0])
        if why_not_stored(result) is not None:
            with self._db() as db:
                db.execute("DELETE FROM results WHERE key = ? AND created_at = ?", (key, row[1]))
            return None
        return {**result, "stored_at": row[1]}

    def put_result(self, key: str, tool: str, result: dict[str, Any]) -> bool:
        """Keep `result` as the answer for `key` if it depends only on the code and inputs; True when kept."""
        if why_not_stored(result) is not None:
            return False
        with self._db() as db:
            db.execute("INSERT OR REPLACE INTO results (key, tool, created_at, result) VALUES (?, ?, ?, ?)",
                       (key, tool, time.time(), json.dumps({k: v for k, v in result.items() if k != "stored_at"})))
        return True

    # -- history of candidates per problem -------------------------------------------------------
    def record_history(self, *, reference_sha256: str, backend: str, candidate_sha256: str, tool: str,
                       correct: bool | None = None, speedup_eager: float | None = None,
                       speedup_compile: float | None = None, median_us: float | None = None,
                       trusted: bool | None = None, profile_id: str | None = None) -> None:
        with self._db() as db:
            db.execute("INSERT INTO history VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (reference_sha256, backend, candidate_sha256, tool, time.time(), correct, speedup_eager,
                        speedup_compile, median_us, trusted, profile_id))

    def history(self, reference_sha256: str) -> list[dict[str, Any]]:
        """The problem's verifies and profiles, oldest first (the latest `_HISTORY_LIMIT`)."""
        with self._db() as db:
            rows = db.execute("SELECT * FROM (SELECT * FROM history WHERE reference_sha256 = ? ORDER BY created_at DESC "
                              "LIMIT ?) ORDER BY created_at", (reference_sha256, _HISTORY_LIMIT)).fetchall()
        return [{k: (bool(r[k]) if k in ("correct", "trusted") and r[k] is not None else r[k]) for k in r.keys()}
                for r in rows]

    def problems_with_history(self) -> list[dict[str, Any]]:
        with self._db() as db:
            rows = db.execute("SELECT reference_sha256, COUNT(*), MAX(created_at) FROM history GROUP BY reference_sha256 "
                              "ORDER BY MAX(created_at) DESC").fetchall()
        return [{"reference_sha256": r[0], "entries": r[1], "last_at": r[2]} for r in rows]

    # -- profiles --------------------------------------------------------------------------------
    def put_profile(self, profile_id: str, key: str, backend: str, result: dict[str, Any]) -> None:
        with self._db() as db:
            db.execute("INSERT OR REPLACE INTO profiles (id, key, backend, created_at, result) VALUES (?, ?, ?, ?, ?)",
                       (profile_id, key, backend, time.time(), json.dumps(result)))

    def amend_profile(self, profile_id: str, result: dict[str, Any], *, speedup_compile: float | None,
                      trusted: bool | None) -> None:
        """A stored profile completed after it answered (a late baseline: `profile._add_late_baseline`), and its
        history entry with it; it keeps its time."""
        with self._db() as db:
            db.execute("UPDATE profiles SET result = ? WHERE id = ?", (json.dumps(result), profile_id))
            db.execute("UPDATE history SET speedup_compile = ?, trusted = ? WHERE profile_id = ?",
                       (speedup_compile, trusted, profile_id))

    def get_profile(self, profile_id: str) -> dict[str, Any] | None:
        with self._db() as db:
            row = db.execute("SELECT result FROM profiles WHERE id = ?", (profile_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def latest_profile_for(self, key: str) -> dict[str, Any] | None:
        """The newest profile for `key` that may answer the request again (`why_not_stored`), with `stored_at`.

        Every profile is kept under its id (its resource and summarize_profile read it); one whose
        verdict the environment decided (a failed background-work or timing check) is never served for a
        repeated request.
        """
        with self._db() as db:
            rows = db.execute("SELECT result, created_at FROM profiles WHERE key = ? ORDER BY created_at DESC LIMIT 50",
                              (key,)).fetchall()
        for text, created_at in rows:
            result = json.loads(text)
            if why_not_stored(result) is None:
                return {**result, "stored_at": created_at}
        return None

    def list_profiles(self, limit: int = 50) -> list[dict[str, Any]]:
        with self._db() as db:
            rows = db.execute("SELECT id, backend, created_at FROM profiles ORDER BY created_at DESC LIMIT ?",
                              (limit,)).fetchall()
        return [{"profile_id": r[0], "backend": r[1], "created_at": r[2]} for r in rows]

    # -- artifacts -------------------------------------------------------------------------------
    def artifact_dir(self, profile_id: str) -> Path:
        if not _SAFE_NAME.match(profile_id):
            raise ValueError(f"bad profile id {profile_id!r}")
        path = self.home / "artifacts" / profile_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def artifact_path(self, profile_id: str, name: str) -> Path | None:
        """The file `name` of a profile, or None; names are checked so no path escapes the store."""
        if not (_SAFE_NAME.match(profile_id) and _SAFE_NAME.match(name)):
            return None
        path = self.home / "artifacts" / profile_id / name
        return path if path.is_file() else None

    def artifact_names(self, profile_id: str) -> list[str]:
        if not _SAFE_NAME.match(profile_id):
            return []
        path = self.home / "artifacts" / profile_id
        return sorted(p.name for p in path.iterdir() if p.is_file()) if path.is_dir() else []

    # -- jobs ------------------------------------------------------------------------------------
    def insert_job(self, row: dict[str, Any]) -> None:
        row = _job_columns(row)
        with self._db() as db:
            db.execute(f"INSERT INTO jobs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))

    def update_job(self, job_id: str, *, expect_owner: str | None = None, **fields: Any) -> bool:
        """Set `fields` of a job; with `expect_owner`, only while that owner holds it (an atomic claim)."""
        unknown = set(fields) - _JOB_UPDATABLE
        if unknown:
            raise ValueError(f"job fields {sorted(unknown)} cannot be updated")
        values = list(_job_columns(fields).values())
        where, args = "job_id = ?", [job_id]
        if expect_owner is not None:
            where, args = where + " AND owner = ?", args + [expect_owner]
        with self._db() as db:
            cur = db.execute(f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in fields)} WHERE {where}", (*values, *args))
            return cur.rowcount == 1

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        with self._db() as db:
            row = db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return _job_row(row) if row else None

    def jobs(self, *, statuses: tuple[str, ...] | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Jobs, newest first (oldest first when filtered by status: the order to resume them in)."""
        with self._db() as db:
            if statuses:
                rows = db.execute(f"SELECT * FROM jobs WHERE status IN ({', '.join('?' * len(statuses))}) "
                                  "ORDER BY created_at LIMIT ?", (*statuses, limit)).fetchall()
            else:
                rows = db.execute("SELECT * FROM jobs ORDER BY created_at DESC LIMIT ?", (limit,)).fetchall()
        return [_job_row(r) for r in rows]

    def prune_jobs(self, older_than_s: float) -> int:
        """Forget finished jobs (their requests hold whole sources) older than `older_than_s`."""
        with self._db() as db:
            cur = db.execute(f"DELETE FROM jobs WHERE status NOT IN ({', '.join('?' * len(ACTIVE_JOB_STATUSES))}) "
                             "AND created_at < ?", (*ACTIVE_JOB_STATUSES, time.time() - older_than_s))
            return cur.rowcount


def _job_columns(fields: dict[str, Any]) -> dict[str, Any]:
    """Column values to write: the JSON columns encoded."""
    return {k: (json.dumps(v) if k in _JOB_JSON and v is not None else v) for k, v in fields.items()}


def _job_row(row: sqlite3.Row) -> dict[str, Any]:
    return {k: (json.loads(row[k]) if k in _JOB_JSON and row[k] is not None else row[k]) for k in row.keys()}
