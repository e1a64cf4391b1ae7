"""Builds by the server for sandboxed workers (issue 17): a worker reads the shared build cache but never writes it;
a build the cache lacks is asked of the server, which runs it here, in a sandbox of its own, and promotes it.

Parent-side process plumbing (a sandboxed builder process, its deadline, its kill), so it lives with the runner;
what the builder does inside its sandbox, and what may be promoted into the cache, is build machinery
(`kforge.backends.build.fast_build`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio

from kforge.backends.build.fast_build import (ARCH_PATTERN, MAX_ANSWER_BYTES, NAME_PATTERN, build_needs_device,
                                              header_to_build, promote_build)
from kforge.backends.build.inline import read_served_build

from .lifecycle import kill_group, worker_env
from .limits import WorkerLimits, confinement

__all__ = ["serve_build_request", "spawn_pch_build"]


async def serve_build_request(home: Path, limits: Any, scratch: Path | None, request: Any,
                              timeout_s: float) -> dict[str, Any]:
    """Build what a sandboxed worker asked for (`kforge.backends.build.inline.InlineBuilder._built_by_server`) and promote it.

    The builder is `python -m kforge.backends.build.inline --build`, in a sandbox of its own whose only writable
    directory is a fresh staging directory outside the cache (it may read the asking job's directory, for
    headers it wrote there). Before it runs any compiler it writes the build's key and header key on a
    descriptor that no compiler inherits; the server promotes under that key, never one named by the worker
    or found in the staging directory, and only the files `promote_build` names. The worker waits meanwhile:
    its candidate cannot reach the staging directory, and the cache is read-only to it.
    """
    if not isinstance(request, dict) or not isinstance(request.get("kwargs"), dict):
        return {"declined": "a malformed build request"}
    kwargs, backend, arch = request["kwargs"], request.get("backend"), request.get("arch") or ""
    name = kwargs.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name) or not isinstance(backend, str) or not isinstance(arch, str) \
            or not ARCH_PATTERN.match(arch) or not NAME_PATTERN.match(backend):
        return {"declined": "an extension name, backend or architecture list it cannot take"}
    cache_dir = home / "cache" / "builds"
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = home / "staging" / uuid.uuid4().hex
    out = staging / "out"
    out.mkdir(parents=True)
    try:
        (staging / "request.json").write_text(json.dumps({"kwargs": kwargs, "backend": backend, "arch": arch,
                                                          "cache_dir": str(cache_dir),
                                                          "precompiled_headers": bool(limits.precompiled_headers)}))
        command = [sys.executable, "-m", "kforge.backends.build.inline", "--build", str(staging / "request.json"), str(out)]
        needs_gpu = build_needs_device(kwargs, arch)  # else the builder's sandbox opens no GPU device node
        if (conf := confinement(home, limits, out, gpu_nodes=None if needs_gpu else ())) is not None:
            from dataclasses import replace

            readable = (*conf.extra_readable, str(staging), *([str(scratch.resolve())] if scratch else []))
            command = [sys.executable, "-m", "kforge.tools.process.sandbox", replace(conf, extra_readable=readable).as_arg(),
                       "--", *command]
        with open(staging / "builder.log", "wb") as errors:
            proc = await anyio.open_process(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
                                            cwd=str(out), env=worker_env(home, out), start_new_session=True)
            data = b""
            try:
                with anyio.fail_after(max(1.0, timeout_s)):
                    async for chunk in proc.stdout:
                        data += chunk
                        if len(data) > MAX_ANSWER_BYTES:
                            break
                    await proc.wait()
            except TimeoutError:
                return {"ok": False, "mode": "plain", "output": f"the build of {name} ran out of the step's time "
                                                                f"({timeout_s:.3g} s) and was stopped"}
            finally:
                with anyio.CancelScope(shield=True):
                    if proc.returncode is None:  # cancelled or late: its processes die with its PID namespace
                        await kill_group(proc)
                    await proc.aclose()
        served = read_served_build(data)
        if served is None:
            tail = (staging / "builder.log").read_text(errors="replace")[-4000:]
            return {"ok": False, "mode": "plain", "output": f"the server's build of {name} did not finish "
                                                            f"(exit {proc.returncode}): {tail}"}
        done = served.done
        answer = {k: done.get(k) for k in ("ok", "how", "not_split", "mode", "output", "generated")}
        built = out / str(done.get("build_dir") or "-")
        answer["build_dir"] = str(built)
        if not done.get("ok"):
            answer["ok"] = False
            return answer
        if built.parent != out or not built.name.startswith(".building-"):
            return {**answer, "ok": False, "output": "the server's builder named no build directory of its own"}
        command = served.main_cpp_commands.get(built.name)
        final = promote_build(cache_dir, name, served.key, built, {"pch_key": served.pch_key, "cmd": command})
        if final is None:
            return {**answer, "ok": False, "output": f"the server's build of {name} made no library {name}.so"}
        answer.update(ok=True, dir=str(final))
        header = header_to_build(home / "cache", done.get("how") or [], served.pch_key, built.name in served.main_cpp_commands,
                                 bool(limits.precompiled_headers))
        if header is not None:
            spawn_pch_build(home, limits, header, final)
        return answer
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def spawn_pch_build(home: Path, limits: WorkerLimits, pch_dir: Path, build_dir: Path) -> None:
    """Start the precompiled-header build a worker asked for, in a sandbox of its own where workers have one, at the
    lowest priority, ending with this server however it ends (`fast_build._die_with`): nobody waits for it (a thread
    starts and reaps it, `_run_pch_build`). Workers never start one themselves, sandbox or not (issue 17): what a
    sandboxed worker starts dies with it, and what one without a sandbox started outlived the server."""
    import threading

    from kforge.backends.build.fast_build import claim_pch

    cache = (home / "cache").resolve()
    if not (pch_dir.resolve().is_relative_to(cache) and build_dir.resolve().is_relative_to(cache)):
        return  # the worker's reply names only the cache's directories
    if not claim_pch(pch_dir):
        return  # built, or a live builder is on it
    command = [sys.executable, "-m", "kforge.backends.build.fast_build", str(pch_dir), str(build_dir)]
    if (conf := confinement(home, limits, pch_dir, gpu_nodes=())) is not None:  # writes its header's directory only
        command = [sys.executable, "-m", "kforge.tools.process.sandbox", conf.as_arg(), "--", *command]
    else:  # a worker without the sandbox built `build_dir` itself: no record of the server's, its build.ninja
        command.insert(3, "--from-ninja")
    threading.Thread(target=_run_pch_build, args=(pch_dir, command, worker_env(home, pch_dir)), name="kforge-pch",
                     daemon=True).start()


def _run_pch_build(pch_dir: Path, command: list[str], env: dict[str, str]) -> None:
    """A header build's own thread: it starts the build and reaps it. The build's parent-death signal fires when
    the thread that started it ends, so that thread must live as long as the build, whichever thread asked (a
    fleet node's job runs in a thread that ends with the job). The marker names the process the build lives in
    (the sandbox's outer one): a build killed before it could clean up leaves a marker seen as stale at once."""
    from kforge.backends.build.fast_build import name_builder

    try:
        proc = subprocess.Popen([sys.executable, "-m", "kforge.backends.build.fast_build", "--die-with", str(os.getpid()),
                                 *command], start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(pch_dir), env=env)
    except OSError:
        (pch_dir / "building").unlink(missing_ok=True)
        return
    name_builder(pch_dir, proc.pid)
    proc.wait()
