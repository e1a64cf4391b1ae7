"""A build-cache hit marks its entry used, server side (issue 17): the cache is read-only in a sandboxed worker, so
its hits could not mark themselves, and `kforge prune` took an entry in use for the coldest. Real builds with a
tiny pybind11-only source (seconds, not a torch-header build)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge.tools.context import ToolContext
from kforge.tools.disk import mark_loaded, prune_caches
from kforge.tools.evaluate import compile_kernel
from kforge.tools.requests import CompileRequest
from kforge.backends.build.fast_build import promote_build
from kforge.tools.process.limits import WorkerLimits

from .test_build_cache_promotion import _code

pytestmark = pytest.mark.anyio

_DAY = 86400.0


def _age(entry: Path, age_s: float) -> None:
    """Make every file and folder of `entry` look last used `age_s` ago (what `prune_caches` orders by)."""
    old = time.time() - age_s
    for root, _dirs, files in os.walk(entry):
        for p in (root, *(os.path.join(root, f) for f in files)):
            os.utime(p, (old, old))


def _cold_entry(builds: Path, age_s: float) -> Path:
    cold = builds / "cold-0"
    cold.mkdir(parents=True)
    (cold / "blob").write_bytes(os.urandom(2**20))
    _age(cold, age_s)
    return cold


def _prune_one(home: Path) -> list[str]:
    """Prune to just under what the caches take now: the least recently used entry goes."""
    total = sum(f.stat().st_blocks * 512 for f in (home / "cache").rglob("*") if f.is_file())
    return prune_caches(home, max_bytes=total - 1).removed


def test_a_process_that_maps_an_old_entry_marks_it_used(tmp_path):
    """What the server does after a worker's load that hit the cache: the entries whose files the worker mapped
    (read in /proc, outside the worker's reach) are marked used."""
    if sys.platform != "linux":
        pytest.skip("/proc/<pid>/maps is Linux's")
    builds = tmp_path / "cache" / "builds"
    hit = builds / "ext-1"
    hit.mkdir(parents=True)
    (hit / "ext.so").write_bytes(os.urandom(2**20))
    _age(hit, 3 * _DAY)
    _cold_entry(builds, _DAY)
    loader = subprocess.Popen([sys.executable, "-c", "import mmap, sys; f = open(sys.argv[1], 'rb'); "
                               "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); print(flush=True); sys.stdin.read()",
                               str(hit / "ext.so")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        loader.stdout.readline()
        mark_loaded(loader.pid, builds)
    finally:
        loader.communicate("")
    assert _prune_one(tmp_path) == ["cache/builds/cold-0"]  # the hit is the newest now; the colder one goes
    assert hit.is_dir()


def test_a_build_promoted_meanwhile_is_marked_used(tmp_path):
    """The server's build of what a worker lacked, found published meanwhile: a hit too."""
    cache = tmp_path / "cache" / "builds"
    built = tmp_path / "built"
    built.mkdir()
    (built / "ext.so").write_bytes(b"\x7fELF")
    final = promote_build(cache, "ext", "0" * 20, built, {"pch_key": "1" * 20, "cmd": ["c++"]})
    _age(final, 3 * _DAY)
    _cold_entry(cache, _DAY)
    assert promote_build(cache, "ext", "0" * 20, built, {"pch_key": "1" * 20, "cmd": ["c++"]}) == final
    assert _prune_one(tmp_path) == ["cache/builds/cold-0"]


async def test_a_hit_in_a_sandboxed_worker_keeps_its_entry_from_pruning(tmp_path):
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits())
    if not ctx.limits.sandbox or sys.platform != "linux":
        pytest.skip("the sandbox is off")
    first = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=_code(5), use_store=False))
    assert first.ok, str(first)
    builds = ctx.home / "cache" / "builds"
    [entry] = builds.iterdir()
    _age(entry, 3 * _DAY)  # built long ago: without the hit, the first to go
    _cold_entry(builds, _DAY)
    again = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=_code(5), use_store=False))  # a new job, a new sandboxed worker
    assert again.ok and again.builds[0].from_cache, str(again)
    assert _prune_one(ctx.home) == ["cache/builds/cold-0"]
    assert entry.is_dir()
