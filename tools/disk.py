"""The disk a data directory takes, and pruning its rebuildable caches to a size cap.

Under `KFORGE_HOME` the store (`kforge.db`, `artifacts/`) holds answers and profiles, which cannot be
made again; `cache/` holds what can: built extensions and precompiled headers (about 0.8 GB each for
torch/extension.h on CPU). The compilers' own caches (torch's extensions, torch.compile's, Triton's) live in each
job's scratch directory; an older KForge kept them under `cache/` too, and those folders are pruned first, whole.
Only the caches are pruned, least recently used first, and never an entry used in the last `KEEP_RECENT_S` (a server
may be about to load it).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from kforge.backends.build.fast_build import mark_used

__all__ = ["CACHES", "KEEP_RECENT_S", "LEGACY_CACHES", "DiskUsage", "PruneReport", "disk_usage", "format_bytes", "mark_loaded", "mark_used",
           "prune_caches"]

# cache/<name>: what it holds, pruned entry by entry.
CACHES = {
    "builds": "built extensions",
    "pch": "precompiled headers",
}
# cache/<name> that an older KForge wrote (the compilers' caches are per job now, `fast_build`): nothing reads them,
# so they are counted, and pruned whole before any current entry.
LEGACY_CACHES = {
    "torch_extensions": "torch's extension builds (left by an older KForge)",
    "inductor": "torch.compile's cache (left by an older KForge)",
    "triton": "Triton's kernel cache (left by an older KForge)",
}
# An entry used this recently may be loaded by a running job: pruning it then could fail that job's build.
KEEP_RECENT_S = 600.0


def _size(path: Path) -> int:
    """Bytes on disk (allocated blocks, as `du` counts) of a file, or under a folder; links are not followed."""
    if path.is_file():
        return path.lstat().st_blocks * 512
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass  # removed while we walked
    return total


def _last_used(path: Path) -> float:
    """The newest change time of `path` or anything in it: a cache hit marks its entry (mark_used). Access times
    say nothing here: merely walking a folder to size it updates them."""
    newest = 0.0
    for root, _dirs, files in os.walk(path):
        for p in (root, *(os.path.join(root, f) for f in files)):
            try:
                st = os.lstat(p)
            except OSError:
                continue
            newest = max(newest, st.st_mtime)
    return newest


def mark_loaded(pid: int, builds: Path) -> None:
    """Mark used every entry of `builds` whose files process `pid` has mapped (the libraries it loaded), as this
    process reads them in /proc: the cache is read-only in a sandboxed worker, so its hits cannot mark themselves,
    and `kforge prune` would take entries in use for cold ones."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return  # gone, or not Linux
    prefix = str(builds.resolve()) + os.sep
    used = set()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, permissions, offset, device, inode, path
        if len(fields) == 6 and fields[5].startswith(prefix):
            used.add(fields[5][len(prefix):].split(os.sep, 1)[0])
    for name in used:
        mark_used(builds / name)


@dataclass(frozen=True)
class DiskUsage:
    home: Path
    store_bytes: int  # kforge.db and artifacts: answers and profiles (not pruned)
    caches: dict[str, int]  # cache name -> bytes
    other_bytes: int  # job scratch and the rest

    @property
    def cache_bytes(self) -> int:
        return sum(self.caches.values())

    @property
    def total_bytes(self) -> int:
        return self.store_bytes + self.cache_bytes + self.other_bytes


def disk_usage(home: Path) -> DiskUsage:
    """What the data directory `home` takes on disk, split into store, caches and the rest."""
    caches = {name: _size(home / "cache" / name) for name in (*CACHES, *LEGACY_CACHES)}
    caches = {name: n for name, n in caches.items() if n or name in CACHES}
    store = _size(home / "artifacts") + sum(_size(p) for p in home.glob("kforge.db*"))
    total = _size(home)
    return DiskUsage(home=home, store_bytes=store, caches=caches, other_bytes=max(0, total - store - sum(caches.values())))


@dataclass
class PruneReport:
    removed: list[str] = field(default_factory=list)  # cache/<name>/<entry>
    freed_bytes: int = 0
    kept_recent: int = 0  # entries over the cap but used too recently to remove
    cache_bytes_after: int = 0

    def __str__(self) -> str:
        text = f"removed {len(self.removed)} cache entries, freed {format_bytes(self.freed_bytes)}; caches now take " \
               f"{format_bytes(self.cache_bytes_after)}"
        if self.kept_recent:
            text += f" ({self.kept_recent} entries used in the last {KEEP_RECENT_S / 60:g} min were kept)"
        return text


def _header_being_built(entry: Path) -> bool:
    """Whether `entry` holds a header build's marker whose builder is alive (one whose builder is gone is left
    over: a build killed with its server)."""
    from kforge.backends.build.fast_build import builder_gone

    marker = entry / "building"
    return marker.exists() and not builder_gone(marker)


def _entries(home: Path) -> list[tuple[float, int, Path]]:
    """(last used, bytes, path) of every prunable cache entry, in the order they go: the legacy folders, then the
    least recently used."""
    legacy = [base for base in (home / "cache" / name for name in LEGACY_CACHES) if base.is_dir()]
    found = []
    for name in CACHES:
        base = home / "cache" / name
        if base.is_dir():
            # A build publishes itself with one rename from .building-*; a header being built has a 'building' marker.
            found += [p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".building-")
                      and not _header_being_built(p)]
    entries = [(_last_used(p), _size(p), p) for p in (*legacy, *found)]
    return [*entries[:len(legacy)], *sorted(entries[len(legacy):], key=lambda e: e[0])]


def prune_caches(home: Path, *, max_bytes: int | None, now: float | None = None) -> PruneReport:
    """Delete cache entries, least recently used first, until the caches take at most `max_bytes`.

    Args:
        home: the data directory.
        max_bytes: the cap; None removes every entry not used in the last KEEP_RECENT_S.
        now: the current time (seconds since the epoch), for tests.

    Returns:
        What was removed and what the caches take afterwards.
    """
    now = time.time() if now is None else now
    entries = _entries(home)
    total = sum(size for _, size, _ in entries)
    report = PruneReport()
    for used, size, path in entries:
        if max_bytes is not None and total <= max_bytes:
            break
        if now - used < KEEP_RECENT_S:
            report.kept_recent += 1
            continue
        shutil.rmtree(path, ignore_errors=True)
        report.removed.append(str(path.relative_to(home)))
        report.freed_bytes += size
        total -= size
    report.cache_bytes_after = total
    return report


def format_bytes(n: float) -> str:
    """Bytes for people: 512 B, 1.3 MB, 790.2 MB, 2.3 GB (powers of 1000, as `du --si`)."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB"):
        n /= 1000
        if n < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} GB"
