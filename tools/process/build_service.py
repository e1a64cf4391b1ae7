"""Builds by the server for sandboxed workers (issue 17): a worker reads the shared build cache but never writes it;
a build the cache lacks is asked of the server, which runs it here, in a sandbox of its own, and promotes it.

Parent-side process plumbing (a sandboxed builder process, its deadline, its kill), so it lives with the runner;
what the builder does inside its sandbox, and what may be promoted into the cache, is build machinery
(`kforge.backends.build.fast_build`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio

from kforge.backends.build.fast_build import ARCH_PATTERN, MAX_ANSWER_BYTES, NAME_PATTERN, mark_used, promote_build

__all__ = ["serve_build_request"]


async def serve_build_request(home: Path, limits: Any, scratch: Path | None, request: Any,
                              timeout_s: float) -> dict[str, Any]:
    """Build what a sandboxed worker asked for (`kforge.backends.build.inline.InlineBuilder._built_by_server`) and promote it.

    The builder is `python -m kforge.backends.build.fast_build --build`, in a sandbox of its own whose only writable
    directory is a fresh staging directory outside the cache (it may read the asking job's directory, for
    headers it wrote there). Before it runs any compiler it writes the build's key and header key on a
    descriptor that no compiler inherits; the server promotes under that key, never one named by the worker
    or found in the staging directory, and only the files `promote_build` names. The worker waits meanwhile:
    its candidate cannot reach the staging directory, and the cache is read-only to it.
    """
    from .runner import confinement, kill_group, worker_env

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
        command = [sys.executable, "-m", "kforge.backends.build.fast_build", "--build", str(staging / "request.json"), str(out)]
        # No GPU device node: nvcc builds for the architecture it is given, and only without one (a triton worker's
        # CUDA sources) does torch ask the GPUs which to build for.
        no_gpu = bool(arch) or not kwargs.get("cuda_sources")
        if (conf := confinement(home, limits, out, gpu_nodes=() if no_gpu else None)) is not None:
            from dataclasses import replace

            readable = (*conf.extra_readable, str(staging), *([str(scratch.resolve())] if scratch else []))
            command = [sys.executable, "-m", "kforge.tools.process.sandbox", replace(conf, extra_readable=readable).as_arg(),
                       "--", *command]
        lines: list[dict[str, Any]] = []
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
        for line in data.decode(errors="replace").splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                lines.append(item)
        head = lines[0] if lines else {}
        done = next((x for x in lines if "done" in x), None)
        key, pch_key = head.get("key"), head.get("pch_key")
        if not (isinstance(key, str) and re.fullmatch(r"[0-9a-f]{20}", key or "") and isinstance(pch_key, str)
                and re.fullmatch(r"[0-9a-f]{20}", pch_key or "")) or done is None:
            tail = (staging / "builder.log").read_text(errors="replace")[-4000:]
            return {"ok": False, "mode": "plain", "output": f"the server's build of {name} did not finish "
                                                            f"(exit {proc.returncode}): {tail}"}
        answer = {k: done.get(k) for k in ("ok", "how", "not_split", "mode", "output", "generated")}
        built = out / str(done.get("build_dir") or "-")
        answer["build_dir"] = str(built)
        if not done.get("ok"):
            answer["ok"] = False
            return answer
        if built.parent != out or not built.name.startswith(".building-"):
            return {**answer, "ok": False, "output": "the server's builder named no build directory of its own"}
        cmds = [x.get("cmd") for x in lines if x.get("ninja") == built.name]
        final = promote_build(cache_dir, name, key, built, {"pch_key": pch_key, "cmd": cmds[-1] if cmds else None})
        if final is None:
            return {**answer, "ok": False, "output": f"the server's build of {name} made no library {name}.so"}
        answer.update(ok=True, dir=str(final))
        how = done.get("how") or []
        if "precompiled header" in how:  # the header the build used (the builder sees the cache read-only)
            mark_used(home / "cache" / "pch" / pch_key)
        elif limits.precompiled_headers and cmds:
            from .runner import spawn_pch_build

            spawn_pch_build(home, limits, home / "cache" / "pch" / pch_key, final)
        return answer
    finally:
        shutil.rmtree(staging, ignore_errors=True)
