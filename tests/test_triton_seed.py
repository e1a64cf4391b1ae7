"""The Triton cache seed (`tools/process/triton_seed.py`): what a fork compiled while it readied reaches the forks
after it, whole entries only, and nothing a worker could plant through a link."""

from __future__ import annotations

import os

from kforge.tools.process import triton_seed


def _entry(cache, name, files=("k.cubin", "k.json")):
    (cache / name).mkdir(parents=True)
    for f in files:
        (cache / name / f).write_text(f"{name}/{f}")


def test_a_readied_forks_new_entries_go_to_the_seed_and_into_the_next_forks_cache(tmp_path):
    seed, first, second = tmp_path / "home" / "cache" / "triton-seed", tmp_path / "w1" / "triton", tmp_path / "w2" / "triton"
    assert triton_seed.seed_dir(tmp_path / "home") == seed
    _entry(first, "AAAA")
    _entry(first, "BBBB")
    (first / "tmp.pid_1_x").mkdir()  # Triton's own staging, mid-write: never shared
    (first / "stray.txt").write_text("not an entry")
    os.symlink("/etc", first / "LINK")  # a link is not followed, nor copied
    assert triton_seed.add_new(first, seed) == ["AAAA", "BBBB"]
    assert sorted(os.listdir(seed)) == ["AAAA", "BBBB"] and (seed / "AAAA" / "k.cubin").read_text() == "AAAA/k.cubin"
    # A second fork made the same entries and one more: only the new one is added.
    _entry(second, "AAAA")
    _entry(second, "CCCC")
    assert triton_seed.add_new(second, seed) == ["CCCC"]
    # The next fork's cache gets every entry, beside what it holds already.
    third = tmp_path / "w3" / "triton"
    _entry(third, "DDDD")
    triton_seed.copy_into(seed, third)
    assert sorted(os.listdir(third)) == ["AAAA", "BBBB", "CCCC", "DDDD"]
    assert (third / "CCCC" / "k.json").read_text() == "CCCC/k.json"


def test_no_seed_no_cache_or_an_entry_too_large_changes_nothing(tmp_path, monkeypatch):
    triton_seed.copy_into(None, tmp_path / "c")
    triton_seed.copy_into(tmp_path / "missing", tmp_path / "c")
    assert not (tmp_path / "c").exists()
    assert triton_seed.add_new(tmp_path / "no-cache", tmp_path / "seed") == []
    monkeypatch.setattr(triton_seed, "_MAX_ENTRY_BYTES", 10)
    _entry(tmp_path / "cache", "BIG", files=("k.cubin",))
    (tmp_path / "cache" / "BIG" / "k.cubin").write_bytes(b"x" * 11)
    assert triton_seed.add_new(tmp_path / "cache", tmp_path / "seed") == [] and os.listdir(tmp_path / "seed") == []
