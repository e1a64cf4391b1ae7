"""What makes a `load_inline` build fast without changing what it builds (runs in workers only).

* **Build keys** name a build by everything that decides its output: sources, flags, the content of
  every header under the candidate's include paths, the compilers' identities and torch's version.
  Same key, same library; any change, a new key (never a stale build).
* **Lean CUDA headers**: a `.cu` source's `#include <torch/extension.h>` becomes `<torch/types.h>`
  (tensors, factories, ATen ops) when the source uses nothing else of it (no pybind11, no torch::nn).
  nvcc parses every header twice (device and host), and the full header is most of a build's time
  (measured on an H100: 53-57 s for the stock relu example, 31 s with the lean header).
* **Builds by the server** (issue 17): a sandboxed worker reads the shared cache but never writes it. A
  build the cache lacks is asked of the server (`kforge.tools.process.build_service`), which runs it in a sandbox of its
  own (no candidate code: only the compiler on the candidate's sources, writing only a private staging
  directory), takes the build's key from the builder *before* any compiler runs, and promotes into
  `cache/builds/<name>-<key>` only copies of the files a build makes, under their expected names.
* **Precompiled headers**: the C++ part (`main.cpp`) starts with `torch/extension.h`; a precompiled
  copy, built once per compile-flag set and kept in the cache, cuts its compile to a fraction. GCC
  uses `<dir>/torch/extension.h.gch` when `<dir>` is searched first and the flags match; it is
  built in the background after the first plain build with those flags, so nobody waits for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from kforge.backends.host import process_stat

__all__ = ["ARCH_PATTERN", "MAX_ANSWER_BYTES", "NAME_PATTERN", "build_key", "build_needs_device", "build_pch_now", "claim_pch",
           "header_to_build", "job_cache_env", "lean_cuda_sources", "main_cpp_flags", "mark_used", "name_builder", "pch_dir_for", "pch_key",
           "promote_build", "toolchain_id"]

BUILD_PATH_VERSION = "3"  # bump when what a key covers, or how a key is built, changes
_HEADER_SUFFIXES = {".h", ".hpp", ".hh", ".cuh", ".inl", ".inc", ".hxx"}
_MAX_HEADER_BYTES = 64 * 2**20
# Parts of torch/extension.h that torch/types.h lacks: sources using them keep the full header.
_NEEDS_FULL_HEADER = re.compile(r"PYBIND11|pybind11|\bpy::|torch::nn\b|torch::optim|torch::data|torch::jit|"
                                r"torch::autograd::Function|torch/extension\.h>.*\n.*torch/python")
_EXTENSION_INCLUDE = re.compile(r"#\s*include\s*[<\"]torch/extension\.h[>\"]")
_PCH_TIMEOUT_S = 900


def _version_text(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return f"{argv[0]}: not found"
    return " ".join((out.stdout or out.stderr).split())


_TOOLCHAIN: dict[bool, str] = {}


def toolchain_id(with_cuda: bool) -> str:
    """The compilers' versions (a compiler upgrade must not reuse old builds); computed once per process."""
    if with_cuda not in _TOOLCHAIN:
        import torch
        from torch.utils import cpp_extension

        parts = [f"torch {torch.__version__} {getattr(torch.version, 'git_version', '')}",
                 f"python {sys.version.split()[0]}", _version_text([os.environ.get("CXX", "c++"), "--version"])]
        if with_cuda:
            nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc") if cpp_extension.CUDA_HOME else "nvcc"
            parts.append(_version_text([nvcc, "--version"]))
        _TOOLCHAIN[with_cuda] = " | ".join(parts)
    return _TOOLCHAIN[with_cuda]


def mark_used(path: Path) -> None:
    """Record that a cache entry was used just now, for least-recently-used pruning (`kforge prune`)."""
    try:
        os.utime(path)
    except OSError:
        pass  # read-only or gone: pruning then goes by the files' own times


def _digest(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _headers_digest(paths: list[str]) -> str:
    """A digest of every header under the candidate's include paths (a changed header is a new build)."""
    h = hashlib.sha256()
    seen = 0
    for root in paths:
        base = Path(root)
        files = sorted(base.rglob("*")) if base.is_dir() else [base] if base.is_file() else []
        for f in files:
            if f.is_file() and (f.suffix in _HEADER_SUFFIXES or f.parent == base):
                data = f.read_bytes()
                seen += len(data)
                if seen > _MAX_HEADER_BYTES:
                    h.update(b"too-large")
                    return h.hexdigest()
                h.update(str(f).encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def build_key(kwargs: dict[str, Any], backend_name: str) -> str:
    """The content address of a build: equal keys mean interchangeable libraries."""
    parts = {k: kwargs.get(k) for k in sorted(kwargs) if k not in ("verbose", "build_directory")}
    with_cuda = bool(kwargs.get("cuda_sources"))
    parts["_toolchain"] = toolchain_id(with_cuda)
    parts["_headers"] = _headers_digest([str(p) for p in kwargs.get("extra_include_paths") or []])
    parts["_backend"] = backend_name
    parts["_arch"] = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    parts["_env"] = {k: os.environ.get(k, "") for k in ("CXX", "CC", "CFLAGS", "CXXFLAGS", "LDFLAGS", "NVCC_FLAGS")}
    parts["_version"] = BUILD_PATH_VERSION
    return _digest(parts)


def lean_cuda_sources(sources: list[str]) -> tuple[list[str], bool]:
    """`sources` with torch/extension.h swapped for torch/types.h where nothing else of it is used."""
    text = "\n".join(sources)
    if not _EXTENSION_INCLUDE.search(text) or _NEEDS_FULL_HEADER.search(text):
        return sources, False
    return [_EXTENSION_INCLUDE.sub("#include <torch/types.h>", s) for s in sources], True


# -- precompiled torch/extension.h ------------------------------------------------------------------

def pch_key(kwargs: dict[str, Any]) -> str:
    """What decides main.cpp's compile flags (not its sources): one precompiled header per value."""
    parts = {k: kwargs.get(k) for k in ("extra_cflags", "extra_include_paths", "with_cuda", "no_implicit_headers")}
    parts["_cuda"] = bool(kwargs.get("cuda_sources"))
    parts["_toolchain"] = toolchain_id(parts["_cuda"])
    parts["_arch"] = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    return _digest(parts)


def pch_dir_for(cache_dir: Path, kwargs: dict[str, Any]) -> tuple[Path, bool]:
    """The precompiled-header directory for these flags, and whether its header is ready to use."""
    where = cache_dir.parent / "pch" / pch_key(kwargs)
    return where, (where / "torch" / "extension.h.gch").exists()


def main_cpp_flags(build_ninja: Path) -> list[str] | None:
    """main.cpp's compile flags, read from the build.ninja torch wrote (exactly what the PCH must match)."""
    try:
        text = build_ninja.read_text()
    except OSError:
        return None
    found = {}
    for key in ("cxx", "cflags", "post_cflags"):
        m = re.search(rf"^{key} = (.*)$", text, flags=re.M)
        found[key] = m.group(1) if m else ""
    if not found["cxx"]:
        return None
    flags = [f for f in shlex.split(found["cflags"] + " " + found["post_cflags"])
             if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    return shlex.split(found["cxx"]) + flags


def builder_gone(marker: Path) -> bool:
    """Is `marker` ("a header build is running") left over: its builder's process gone (killed with the
    machine's other processes, say), or older than any build may take?"""
    try:
        text, age = marker.read_text().strip(), time.time() - marker.stat().st_mtime
    except OSError:
        return False  # no marker
    if age > _PCH_TIMEOUT_S + 60:
        return True
    if not text.isdigit():
        return False  # just created: the claimer has not written its builder's process id yet
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    stat = process_stat(text)
    return stat is not None and stat[1] == "Z"  # ended, and not yet reaped by the parent it was handed to


def _promoted_pch_command(pch_dir: Path, build_dir: Path) -> list[str] | None:
    """main.cpp's compile command as the server recorded it when it promoted `build_dir` (taken from the
    build.ninja torch wrote before any compiler ran: a compiler the candidate's flags subverted cannot have
    changed it), None unless `pch_dir` is the header directory of that build's own flags."""
    try:
        recorded = json.loads((build_dir / _PCH_RECORD).read_text())
    except (OSError, ValueError):
        return None
    cmd = recorded.get("cmd") if isinstance(recorded, dict) else None
    if recorded.get("pch_key") != pch_dir.name or not isinstance(cmd, list) or not all(isinstance(c, str) for c in cmd):
        return None
    return cmd


def header_to_build(cache: Path, how: Sequence[str], header_key: str, has_command: bool, enabled: bool) -> Path | None:
    """After the server promoted a build into `cache`/builds: the precompiled header to build next in the background,
    or None. A build that used one marks it used (the builder saw the cache read-only); one that did not asks for its
    header where headers are on and torch's build step recorded main.cpp's command to build it with."""
    pch_dir = cache / "pch" / header_key
    if "precompiled header" in how:
        mark_used(pch_dir)
        return None
    return pch_dir if enabled and has_command else None


def claim_pch(pch_dir: Path) -> bool:
    """Claim the header build of `pch_dir` by creating its marker ("a header build is running"); False when the
    header is built or a live builder holds the marker. The claimer then names the process whose end ends the
    build (`name_builder`), and the builder removes the marker when it is done (`build_pch_now`)."""
    marker = pch_dir / "building"
    if builder_gone(marker):
        marker.unlink(missing_ok=True)  # its builder died without cleaning up
    if (pch_dir / "torch" / "extension.h.gch").exists():
        return False
    pch_dir.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False  # another builder is on it
    return True


def name_builder(pch_dir: Path, pid: int) -> None:
    """Write into the claimed marker the process, as the claimer sees it, that lives exactly as long as the build:
    once it is gone the marker is stale (`builder_gone`). For a sandboxed builder that is the sandbox's outer
    process, outside the builder's PID namespace (the builder's own pid means nothing outside it)."""
    (pch_dir / "building").write_text(f"{pid}\n")


def _compile_header(cmd: list[str], pch_dir: Path) -> None:
    """Compile torch/extension.h with main.cpp's flags under a unique name, renamed into place, so concurrent
    builders and readers only ever see a whole file. The compiler leads a process group of its own (GCC's
    cc1plus runs in it), killed whole at the time limit or when this builder is told to end (`_end_on_sigterm`):
    nothing of a build outlives its builder."""
    import importlib.util

    header = pch_dir / "torch" / "extension.h"
    header.parent.mkdir(parents=True, exist_ok=True)
    if not header.exists():  # torch's (`cpp_extension.include_paths()[0]`), found without importing torch: a builder
        # that imported it took 6 s to end when told to, at the lowest priority on a busy 2-core VM
        torch_dir = Path(importlib.util.find_spec("torch").origin).parent
        shutil.copyfile(torch_dir / "include" / "torch" / "extension.h", header)
    tmp = header.with_name(f"extension.h.gch.{uuid.uuid4().hex[:8]}")
    with open(pch_dir / "build.log", "wb") as log:
        proc = subprocess.Popen([*cmd, "-x", "c++-header", str(header), "-o", str(tmp)], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, cwd=str(pch_dir), process_group=0)
    try:
        if proc.wait(timeout=_PCH_TIMEOUT_S) == 0:
            os.replace(tmp, header.with_name("extension.h.gch"))
    except subprocess.TimeoutExpired:
        pass  # ended below, with everything it started
    finally:
        if proc.returncode is None:  # the time limit, or this builder told to end: its group is still there
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        tmp.unlink(missing_ok=True)


def _end_on_sigterm() -> None:
    """SIGTERM ends the builder through its `finally` clauses (the compiler's group killed, the marker removed):
    the server's death reaches a builder outside any PID namespace as SIGTERM (`_die_with`)."""
    def end(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, end)


def build_pch_now(pch_dir: Path, build_dir: Path, *, promoted: bool = True) -> None:
    """The claimed header build (`claim_pch`), in the builder process its claimer started, which removes the marker
    when done. With the command the server recorded for a build it promoted (`_promoted_pch_command`); where there is
    none and not `promoted` (a build a worker without the sandbox made), with the flags of `build_dir`'s build.ninja."""
    _end_on_sigterm()
    try:
        cmd = _promoted_pch_command(pch_dir, build_dir)
        if cmd is None and not promoted:
            cmd = main_cpp_flags(build_dir / "build.ninja")
        if cmd is not None and not (pch_dir / "torch" / "extension.h.gch").exists():
            _compile_header(cmd, pch_dir)
    finally:
        (pch_dir / "building").unlink(missing_ok=True)


def _die_with(parent: int, argv: list[str]) -> None:
    """The server's child for a header build (`build_service.spawn_pch_build`): at the lowest priority, and ending when the
    server ends, however it ends (SIGKILL included), it becomes `argv`: the sandbox that holds the builder, whose
    PID namespace dies with it, or the builder itself, which ends its compiler's group on that signal.

    The kernel's parent-death signal survives exec and fires when the server's thread that started this process
    ends: one that waits for the build (`build_service._run_pch_build`). Linux shares CPU time between sessions
    (autogroups), so `nice` alone ranks the build only within its session (it leads one): its priority is lowered too.
    """
    import ctypes

    try:
        Path("/proc/self/autogroup").write_text("19")
    except OSError:
        pass  # no autogroups here: nice alone
    os.nice(19)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the build ends at its time limit
    if os.getppid() != parent:  # the server died before the request took effect
        os._exit(0)
    os.execvp(argv[0], argv)


def job_cache_env(scratch: Path | str) -> dict[str, str]:
    """Temporary files and the caches code in a worker writes as it runs, all in the job's own directory (issue 17:
    a cache shared between jobs passes notes, and one job's entries would be loaded by the next). torch.compile's
    and Triton's caches hold code a later process loads, written by the candidate's own process: they cannot be
    checked, so they are per job. The C++/CUDA build cache is shared, read-only, filled by the server."""
    scratch = Path(scratch)
    return {"TMPDIR": str(scratch),
            "TORCH_EXTENSIONS_DIR": str(scratch / "torch_extensions"),
            "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
            "TRITON_CACHE_DIR": str(scratch / "triton"),
            "CUDA_CACHE_PATH": str(scratch / "nv")}  # the driver's JIT cache


# -- builds by the server, promoted into the shared cache (issue 17) ---------------------------------------

_PCH_RECORD = "kforge-pch.json"  # written by the server into a promoted build: its header key and main.cpp command
NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")  # an extension's name (a Python module name)
ARCH_PATTERN = re.compile(r"^[0-9A-Za-z.;+ ]{0,200}$")  # TORCH_CUDA_ARCH_LIST


def build_needs_device(kwargs: dict[str, Any], arch: str) -> bool:
    """Whether a server-side build of `load_inline(**kwargs)` must see a GPU: nvcc builds for the architecture it is
    given (`arch`, TORCH_CUDA_ARCH_LIST), and only without one (a triton worker's CUDA sources) does torch ask the
    GPUs which to build for. C++ alone never does."""
    return not arch and bool(kwargs.get("cuda_sources"))
MAX_ANSWER_BYTES = 16 * 2**20
_MAX_PROMOTED_BYTES = 4 * 2**30


def _promoted_names(name: str) -> tuple[str, ...]:
    """The files of a build that go into the cache, by their exact names (nothing else does: objects,
    ninja's logs, anything a subverted compiler left there)."""
    from .compiler_report import VEC_REPORT_FILE

    return (f"{name}.so", "main.cpp", "cuda.cu", "build.ninja", "kforge-build.log", "kforge-kernels.json", VEC_REPORT_FILE)


def _copy_regular(src: Path, dst: Path, budget: int) -> int:
    """Copy `src` if it is a regular file (never through a link) into the new file `dst`; returns bytes copied."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    with os.fdopen(fd, "rb") as f:
        import stat

        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > budget:
            return 0
        with open(dst, "xb") as out:
            shutil.copyfileobj(f, out, 1 << 20)
        os.chmod(dst, 0o755 if dst.suffix == ".so" else 0o644)
        return st.st_size


def promote_build(cache_dir: Path, name: str, key: str, built: Path, pch_record: dict[str, Any]) -> Path | None:
    """Copy what the server's builder made in `built` into the cache as `<name>-<key>` (the key the builder gave
    before any compiler ran), with `pch_record` beside it; None when the build left no library. A build already
    there (published meanwhile) is kept."""
    final = cache_dir / f"{name}-{key}"
    if any(final.glob(f"{name}*.so")):
        mark_used(final)  # a hit: `kforge prune` removes the least recently used builds first
        return final
    tmp = cache_dir / f".building-promoted-{name}-{uuid.uuid4().hex[:12]}"  # `kforge prune` keeps .building-*
    tmp.mkdir(parents=True)
    try:
        budget = _MAX_PROMOTED_BYTES
        for file_name in _promoted_names(name):
            budget -= _copy_regular(built / file_name, tmp / file_name, budget)
        if not (tmp / f"{name}.so").exists():
            return None
        (tmp / _PCH_RECORD).write_text(json.dumps(pch_record))
        try:
            os.rename(tmp, final)
        except OSError:  # another build published it first: keep theirs
            pass
        return final if any(final.glob(f"{name}*.so")) else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "--die-with":  # the server's child for a header build: SERVER_PID COMMAND...
        _die_with(int(sys.argv[2]), sys.argv[3:])
    elif sys.argv[1] == "--from-ninja":  # a header build for a worker without the sandbox: PCH_DIR BUILD_DIR
        build_pch_now(Path(sys.argv[2]), Path(sys.argv[3]), promoted=False)
    else:  # the server's header build, inside its sandbox: PCH_DIR BUILD_DIR
        build_pch_now(Path(sys.argv[1]), Path(sys.argv[2]))
