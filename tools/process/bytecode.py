"""Byte-code for interpreters whose packages carry none, so that a worker does not compile torch from source.

A pip install compiles each package's `.py` files into `__pycache__` beside them. Container images often do not:
they strip the `.pyc` files and set PYTHONDONTWRITEBYTECODE. Then every process compiles what it imports.
- On such a host (the device tool's H200 image: torch's 2,141 files, none compiled), a fork server's imports
  took 11-17 s and a new server's first verify waited 16 s for its workers (s24).
- On a 2-core VM, one fork server's imports took 2.7 s with byte-code and 9.6 s without (`bench/explore/cold_start.py`).

There, the server compiles the standard library and torch's stack once, in parallel, into `cache/pycache` under
its data directory (`compileall`, with PYTHONPYCACHEPREFIX), and every worker reads it from there. Trust is the
cache's usual one:
- The server writes the cache, and the fork servers add what else they import. Both run KForge's code only.
- Workers find it read-only in their sandbox and never write byte-code (PYTHONDONTWRITEBYTECODE), so a candidate
  cannot plant code for the next judge.

Where torch has its byte-code, nothing here runs. A prefix would hide the `__pycache__` folders that do exist.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

__all__ = ["ensure_bytecode", "pycache_prefix"]

# torch's stack as a fork server imports it; compileall also covers what loads later (Inductor's code generation
# in a judge's first torch.compile). What else is imported is written by the fork servers as they import it.
_PACKAGES = ("torch", "triton", "sympy", "mpmath", "numpy", "networkx", "jinja2", "markupsafe", "filelock", "fsspec",
             "kforge")
_SKIP = r"[/\\](tests?|idlelib|tkinter|turtledemo|lib2to3|ensurepip)[/\\]"
# The standard library's folder may hold site-packages (an interpreter without a venv): only the packages above.
_COMPILE = """
import compileall, json, re, sys
stdlib, packages, skip = json.loads(sys.argv[1])
ok = compileall.compile_dir(stdlib, quiet=1, workers=0,
                            rx=re.compile(skip + "|" + re.escape(stdlib) + r"[/\\\\](site|dist)-packages[/\\\\]"))
for d in packages:
    ok &= compileall.compile_dir(d, quiet=1, workers=0, rx=re.compile(skip))
sys.exit(0 if ok else 1)
"""


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)  # a top-level name: found, not imported
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent if spec is not None and spec.origin else None


@functools.lru_cache(maxsize=1)
def _torch_lacks_bytecode() -> bool:
    torch = _package_dir("torch")
    return torch is not None and not (torch / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc").exists()


def pycache_prefix(home: Path) -> Path | None:
    """Where workers read byte-code (PYTHONPYCACHEPREFIX): `cache/pycache` where torch has none of its own, else
    None (each package's `__pycache__`, as usual)."""
    return Path(home) / "cache" / "pycache" if _torch_lacks_bytecode() else None


def _stamp(prefix: Path) -> Path:
    version = _package_dir("torch") / "version.py"  # the caller found torch
    mtime = int(version.stat().st_mtime) if version.exists() else 0
    return prefix / f".compiled-{sys.implementation.cache_tag}-{mtime}"


def ensure_bytecode(home: Path, timeout_s: float = 600) -> dict[str, object] | None:
    """Compile the standard library and torch's stack into `pycache_prefix(home)`, once per interpreter and torch
    install: None where no prefix is needed. Else what was done, for the trace: the prefix, whether it compiled, and
    its seconds. A failure is said, not raised: workers then compile what is missing as before."""
    prefix = pycache_prefix(home)
    if prefix is None:
        return None
    stamp = _stamp(prefix)
    if stamp.exists():
        return {"prefix": str(prefix), "compiled": False, "s": 0.0}
    prefix.mkdir(parents=True, exist_ok=True)
    packages = [str(d) for d in map(_package_dir, _PACKAGES) if d is not None]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(prefix)
    started = time.perf_counter()
    try:
        args = json.dumps([sysconfig.get_path("stdlib"), packages, _SKIP])
        done = subprocess.run([sys.executable, "-c", _COMPILE, args], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"prefix": str(prefix), "compiled": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    seconds = round(time.perf_counter() - started, 3)
    # compileall exits 1 when some file does not compile (a package's Python 2 leftovers): the rest is written.
    stamp.write_text(f"{seconds} s, exit {done.returncode}\n")
    return {"prefix": str(prefix), "compiled": True, "s": seconds, "exit": done.returncode}
