"""A server that died mid-job leaves its scratch directories behind; the next server on the data directory
removes them, and only them (`kforge.tools.context.sweep_leftovers`)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from kforge.tools.context import sweep_leftovers
from kforge.tools.process.lifecycle import scratch_name


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_the_directories_of_gone_servers_of_this_host_are_removed(tmp_path):
    jobs = tmp_path / "jobs"
    host, dead = socket.gethostname(), _dead_pid()
    mine = jobs / scratch_name("20261124-verify")  # this (live) process's
    gone_job = jobs / f"20261124-verify-aaaa+{dead}@{host}"
    gone_worker = jobs / f"w-bbbb+{dead}@{host}"
    elsewhere = jobs / f"w-cccc+{dead}@another-host.example"  # a shared data directory: not ours to judge
    old_layout, new_layout = jobs / "20261101-verify-dddd", jobs / "w-eeee"
    for d in (mine, gone_job, gone_worker, elsewhere, old_layout, new_layout):
        (d / "candidate").mkdir(parents=True)
        (d / "candidate" / "out.bin").write_bytes(b"x" * 100)
    (gone_job / "judge").symlink_to(gone_worker)  # a role's scratch is a warm worker's own directory
    day_ago = time.time() - 2 * 24 * 3600
    os.utime(old_layout, (day_ago, day_ago))

    removed = sweep_leftovers(jobs)

    assert sorted(removed) == sorted([gone_job.name, gone_worker.name, old_layout.name])
    assert not gone_job.exists() and not gone_worker.exists() and not old_layout.exists()
    assert mine.exists() and elsewhere.exists() and new_layout.exists()
    assert mine.name.endswith(f"+{os.getpid()}@{host}")


def test_no_jobs_directory_is_nothing_to_do(tmp_path):
    assert sweep_leftovers(tmp_path / "jobs") == []
