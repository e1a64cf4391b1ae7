"""The byte-code cache for interpreters whose packages carry none (`kforge.tools.process.bytecode`): compiled once
into the data directory's cache, read by every worker through PYTHONPYCACHEPREFIX, never where torch has its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kforge.tools.process import bytecode
from kforge.tools.process.lifecycle import worker_env


@pytest.fixture
def bare_torch(tmp_path, monkeypatch):
    """A `torch` with no byte-code beside it, and a small standard library: what a stripped container image has."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("VALUE = 41 + 1\n")
    (site / "torch" / "version.py").write_text("__version__ = '0'\n")
    (site / "torch" / "tests").mkdir()
    (site / "torch" / "tests" / "test_x.py").write_text("pass\n")
    stdlib = tmp_path / "stdlib"
    (stdlib / "site-packages" / "other").mkdir(parents=True)
    (stdlib / "json_like.py").write_text("X = 1\n")
    (stdlib / "site-packages" / "other" / "__init__.py").write_text("pass\n")
    monkeypatch.setattr(bytecode, "_package_dir", lambda name: site / "torch" if name == "torch" else None)
    monkeypatch.setattr(bytecode.sysconfig, "get_path", lambda name, *a, **k: str(stdlib))
    bytecode._torch_lacks_bytecode.cache_clear()
    yield site, stdlib
    bytecode._torch_lacks_bytecode.cache_clear()


def _cached(prefix: Path, source: Path) -> Path:
    return prefix / str(source.parent).lstrip("/") / f"{source.stem}.{sys.implementation.cache_tag}.pyc"


def test_a_torch_without_byte_code_is_compiled_once_into_the_cache_and_workers_are_pointed_at_it(tmp_path, bare_torch):
    site, stdlib = bare_torch
    home = tmp_path / "home"
    done = bytecode.ensure_bytecode(home)
    prefix = home / "cache" / "pycache"
    assert done is not None and done["compiled"] and done["exit"] == 0, done
    assert _cached(prefix, site / "torch" / "__init__.py").exists()
    assert _cached(prefix, stdlib / "json_like.py").exists()
    assert not _cached(prefix, site / "torch" / "tests" / "test_x.py").exists()  # tests are not imported
    assert not _cached(prefix, stdlib / "site-packages" / "other" / "__init__.py").exists()  # only torch's stack
    assert not (site / "torch" / "__pycache__").exists()  # nothing written beside the install
    again = bytecode.ensure_bytecode(home)
    assert again == {"prefix": str(prefix), "compiled": False, "s": 0.0}

    env = worker_env(home, tmp_path / "scratch")
    assert env["PYTHONPYCACHEPREFIX"] == str(prefix) and env["PYTHONDONTWRITEBYTECODE"] == "1"
    # A worker's interpreter loads the cached byte-code (a source changed after it would be recompiled, not trusted).
    probe = ("import importlib.util, sys; sys.path.insert(0, sys.argv[1]); import torch; "
             "print(torch.VALUE, importlib.util.cache_from_source(torch.__file__))")
    out = subprocess.run([sys.executable, "-c", probe, str(site)], env=env, capture_output=True, text=True, check=True)
    value, cached = out.stdout.split()
    assert value == "42" and Path(cached) == _cached(prefix, site / "torch" / "__init__.py")


def test_where_torch_has_its_byte_code_nothing_is_compiled_and_workers_read_their_own(tmp_path, monkeypatch):
    site = tmp_path / "site" / "torch"
    (site / "__pycache__").mkdir(parents=True)
    (site / "__init__.py").write_text("")
    (site / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc").write_bytes(b"")
    monkeypatch.setattr(bytecode, "_package_dir", lambda name: site if name == "torch" else None)
    bytecode._torch_lacks_bytecode.cache_clear()
    try:
        assert bytecode.ensure_bytecode(tmp_path / "home") is None
        assert not (tmp_path / "home" / "cache").exists()
        assert "PYTHONPYCACHEPREFIX" not in worker_env(tmp_path / "home", tmp_path / "scratch")
    finally:
        bytecode._torch_lacks_bytecode.cache_clear()
