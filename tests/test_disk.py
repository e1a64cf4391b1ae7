"""What the data directory takes, and pruning its caches least recently used first."""

from __future__ import annotations

import os
import time

from kforge.tools.disk import KEEP_RECENT_S, disk_usage, format_bytes, mark_used, prune_caches


def _entry(path, mb: int, age_s: float) -> None:
    path.mkdir(parents=True)
    with open(path / "blob", "wb") as f:
        f.write(os.urandom(mb * 2**20))  # real blocks, so the sizes are what du would say
    old = time.time() - age_s
    for p in (path / "blob", path):
        os.utime(p, (old, old))


def test_usage_and_prune_to_a_cap(tmp_path):
    cache = tmp_path / "cache"
    _entry(cache / "pch" / "a", 3, age_s=3 * 86400)           # oldest: goes first
    _entry(cache / "builds" / "relu-1", 2, age_s=2 * 86400)
    _entry(cache / "builds" / "relu-2", 1, age_s=86400)
    _entry(cache / "builds" / "fresh", 1, age_s=10)            # in use: never pruned
    _entry(cache / "builds" / ".building-x", 1, age_s=86400)   # a build in progress: never pruned
    _entry(cache / "pch" / "being-built", 1, age_s=86400)
    (cache / "pch" / "being-built" / "building").touch()
    (tmp_path / "kforge.db").write_bytes(b"x" * 8192)
    usage = disk_usage(tmp_path)
    assert usage.caches["pch"] >= 4 * 2**20 and usage.caches["builds"] >= 5 * 2**20
    assert usage.store_bytes >= 8192 and usage.total_bytes >= usage.cache_bytes + usage.store_bytes

    report = prune_caches(tmp_path, max_bytes=int(4.5 * 2**20))
    assert report.removed == ["cache/pch/a"] and report.freed_bytes >= 3 * 2**20
    assert not (cache / "pch" / "a").exists() and (cache / "builds" / "fresh").exists()
    assert (cache / "builds" / ".building-x").exists() and (cache / "pch" / "being-built").exists()
    assert report.cache_bytes_after <= 4.5 * 2**20 and (tmp_path / "kforge.db").exists()

    everything = prune_caches(tmp_path, max_bytes=None)
    assert (cache / "builds" / "fresh").exists() and everything.kept_recent == 1
    assert "used in the last 10 min were kept" in str(everything)


def test_a_used_entry_is_kept_over_an_older_one(tmp_path):
    cache = tmp_path / "cache" / "builds"
    _entry(cache / "old-but-used", 1, age_s=5 * 86400)
    _entry(cache / "newer", 1, age_s=86400)
    mark_used(cache / "old-but-used")
    later = time.time() + KEEP_RECENT_S + 1
    report = prune_caches(tmp_path, max_bytes=2**20 + 8192, now=later)
    assert report.removed == ["cache/builds/newer"]


def test_an_older_kforges_compiler_caches_are_counted_and_pruned_first_whole(tmp_path):
    """Jobs keep the compilers' caches in their scratch now; the folders an older KForge left under cache/ are
    counted, and go before any current entry, however recently they changed (but not within KEEP_RECENT_S)."""
    cache = tmp_path / "cache"
    _entry(cache / "builds" / "relu-1", 1, age_s=5 * 86400)
    _entry(cache / "triton" / "abc", 1, age_s=3600)
    _entry(cache / "inductor" / "xyz", 1, age_s=3600)
    old = time.time() - 3600
    for legacy in (cache / "triton", cache / "inductor"):
        os.utime(legacy, (old, old))
    usage = disk_usage(tmp_path)
    assert usage.caches["triton"] >= 2**20 and usage.caches["inductor"] >= 2**20
    assert "torch_extensions" not in usage.caches  # absent: not listed
    report = prune_caches(tmp_path, max_bytes=int(1.5 * 2**20))
    assert sorted(report.removed) == ["cache/inductor", "cache/triton"], report.removed
    assert (cache / "builds" / "relu-1").exists()


def test_format_bytes():
    assert [format_bytes(n) for n in (512, 1300, 790_200_000, 2.3e9)] == ["512 B", "1.3 KB", "790.2 MB", "2.3 GB"]
