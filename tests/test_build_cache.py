"""The build cache: a repeated build is a hit, any change that matters is a rebuild (never a stale
library), concurrent builders of one candidate share one published build, and warm workers serve
jobs. Real builds with a tiny pybind11-only source (seconds, not a torch-header build)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import pytest

from kforge.server.prewarm import prewarm_builds
from kforge.tools.context import ToolContext
from kforge.tools.evaluate import compile_kernel, verify_against_reference
from kforge.tools.requests import CompileRequest, VerifyRequest
from kforge.backends.build.fast_build import build_key, lean_cuda_sources
from kforge.tools.harness.loader import sweep_abandoned_builds
from kforge.tools.process.lifecycle import kill_group
from kforge.tools.process.limits import WorkerLimits

from .conftest import stdio_session

pytestmark = pytest.mark.anyio


def tiny(include_dir: Path, *, flag: str = "-DSCALE=2", expect: int = 14, body: str = "a * SCALE + OFFSET") -> str:
    """A candidate whose import asserts what its build computes: a stale build fails the import."""
    return f'''
from torch.utils.cpp_extension import load_inline
src = """
#include <pybind11/pybind11.h>
#include "offset.h"
int f(int a) {{ return {body}; }}
"""
ext = load_inline(name="kf_tiny", cpp_sources=src, functions=["f"], no_implicit_headers=True,
                  with_pytorch_error_handling=False, extra_cflags=["{flag}"], extra_include_paths=[r"{include_dir}"])
assert ext.f(5) == {expect}, f"stale build: f(5) = {{ext.f(5)}}, expected {expect}"

import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
'''


@pytest.fixture
def ctx(tmp_path) -> ToolContext:
    return ToolContext(home=tmp_path / "home", limits=WorkerLimits(read_paths=(str(tmp_path / "include"),)))


@pytest.fixture
def include_dir(tmp_path) -> Path:
    d = tmp_path / "include"
    d.mkdir()
    (d / "offset.h").write_text("#define OFFSET 4\n")
    return d


async def build(ctx: ToolContext, code: str):
    result = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=code, use_store=False))
    assert result.ok, str(result)
    [info] = result.builds
    return info


async def test_changed_source_flag_or_header_rebuilds_and_repeats_hit(ctx, include_dir):
    first = await build(ctx, tiny(include_dir))  # 5 * 2 + 4
    assert not first.from_cache
    again = await build(ctx, tiny(include_dir))
    assert again.from_cache and again.seconds < 1.0, again
    assert not (await build(ctx, tiny(include_dir, flag="-DSCALE=3", expect=19))).from_cache
    assert not (await build(ctx, tiny(include_dir, body="a * SCALE - OFFSET", expect=6))).from_cache
    (include_dir / "offset.h").write_text("#define OFFSET 5\n")  # same sources and flags, new header
    assert not (await build(ctx, tiny(include_dir, expect=15))).from_cache
    builds = ctx.home / "cache" / "builds"
    assert len([d for d in builds.iterdir() if d.name.startswith("kf_tiny-")]) == 4
    assert not [d for d in builds.iterdir() if d.name.startswith(".building")], "a private build was left behind"


async def test_concurrent_builders_publish_one_build(ctx, include_dir):
    code = tiny(include_dir, flag="-DSCALE=4", expect=24)
    results = []

    async def one() -> None:
        results.append(await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=code, use_store=False)))

    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(one)
    assert all(r.ok for r in results), [str(r) for r in results]
    builds = ctx.home / "cache" / "builds"
    assert len([d for d in builds.iterdir() if d.name.startswith("kf_tiny-")]) == 1
    assert not [d for d in builds.iterdir() if d.name.startswith(".building")]
    assert (await build(ctx, code)).from_cache


async def test_failed_build_is_reported_and_not_cached(ctx, include_dir):
    code = tiny(include_dir, body="a * SCALE + OFFSET + undefined_name")
    result = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=code, use_store=False))
    assert not result.ok and result.failure.kind == "build_error"
    assert "undefined_name" in result.failure.message and result.failure.line == 6, str(result)
    assert not list((ctx.home / "cache" / "builds").iterdir())


def test_abandoned_private_build_directories_are_swept(tmp_path):
    old, live = tmp_path / ".building-a-1", tmp_path / ".building-b-2"
    for d in (old, live):
        (d / "obj").mkdir(parents=True)
    os.utime(old, (time.time() - 7 * 3600,) * 2)
    published = tmp_path / "ext-key"
    published.mkdir()
    os.utime(published, (time.time() - 7 * 3600,) * 2)
    assert sweep_abandoned_builds(tmp_path) == [old]
    assert not old.exists() and live.exists() and published.exists()


def test_build_key_covers_header_content(tmp_path):
    (tmp_path / "a.h").write_text("#define A 1\n")
    kwargs = {"name": "x", "cpp_sources": ["int f();"], "extra_include_paths": [str(tmp_path)]}
    before = build_key(kwargs, "cpu")
    assert build_key(dict(kwargs), "cpu") == before
    (tmp_path / "a.h").write_text("#define A 2\n")
    assert build_key(kwargs, "cpu") != before
    assert build_key({**kwargs, "extra_cflags": ["-O2"]}, "cpu") != build_key(kwargs, "cpu")


def test_lean_cuda_header_only_where_nothing_else_is_needed():
    plain = ["#include <torch/extension.h>\n__global__ void k() {}\ntorch::Tensor f(torch::Tensor x) { return x; }"]
    lean, swapped = lean_cuda_sources(plain)
    assert swapped and "#include <torch/types.h>" in lean[0] and lean[0].count("\n") == plain[0].count("\n")
    for needs_full in ("PYBIND11_MODULE(m, x) {}", "namespace py = pybind11;", "torch::nn::Linear l{nullptr};"):
        assert lean_cuda_sources([plain[0] + "\n" + needs_full]) == ([plain[0] + "\n" + needs_full], False)


async def test_the_first_new_candidate_after_start_uses_the_precompiled_header(tmp_path, cpu_example):
    """A server builds its examples at start; the header for their flags is then precompiled for the next build."""
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(precompiled_headers=True))
    built = await prewarm_builds(ctx)
    assert "cpu" in [b.split(":")[0] for b in built], built
    with anyio.fail_after(900):  # compiling torch/extension.h in the background: about a minute on 2 cores
        while not list((ctx.home / "cache" / "pch").glob("*/torch/extension.h.gch")):
            await anyio.sleep(1)
    new = cpu_example["candidate"].replace("#include <torch/extension.h>", "#include <torch/extension.h>\n// new", 1)
    result = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=new, use_store=False))
    assert result.ok, str(result)
    [build] = result.builds
    assert not build.from_cache and "precompiled header" in build.fast_paths, build


def _header_builds(home: Path) -> dict[int, str]:
    """The background header builds of this data directory: pid -> command line (they run in a header's directory)."""
    where, found = str(home / "cache" / "pch"), {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/cwd").startswith(where):
                    found[int(entry.name)] = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
    return found


async def test_a_background_header_build_does_not_fail_an_honest_candidate(tmp_path, cpu_example):
    """KForge's own header precompile is never the candidate's background work (it once made honest OpenMP
    candidates WRONG: the build started in the candidate's worker and was still running when it was checked).

    The verify's candidate worker finds the candidate's build in the cache and, the header for its flags
    missing, starts the header build (about a minute of compiling) just before the candidate runs.
    """
    home = tmp_path / "home"
    home.mkdir()
    # Flags of its own: the server's start-up build of the example precompiles the header for the example's flags only.
    flag = "-DKFORGE_OWN_FLAGS"
    cand = cpu_example["candidate"].replace('extra_cflags=["-O3", "-fopenmp"]', f'extra_cflags=["-O3", "-fopenmp", "{flag}"]')
    assert cand != cpu_example["candidate"]
    try:
        async with stdio_session(home) as client:  # header builds off: fill the build cache
            for code in (cpu_example["candidate"], cand):
                built = await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": code})
                assert built.structured_content["ok"], built.content[0].text
        assert not (home / "cache" / "pch").exists()
        async with stdio_session(home, KFORGE_PRECOMPILED_HEADERS="true") as client:
            answer = await client.call_tool("verify_against_reference", {
                "backend": "cpu", "reference_code": cpu_example["reference"], "candidate_code": cand, "trials": 2})
            running = _header_builds(home)
            headers = sorted((home / "cache" / "pch").iterdir())
    finally:
        for pid in _header_builds(home):  # started by this test's servers, under its own data directory
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    verdict = answer.structured_content
    checks = {c["name"]: c for c in verdict["checks"]}
    assert verdict["correct"], answer.content[0].text
    assert checks["no_background_work"]["status"] == "pass", checks["no_background_work"]
    assert [b["from_cache"] for b in verdict["compile"]["builds"]] == [True]
    # This verify started the header build for the candidate's flags: it was running when the verdict came
    # back, or it made a second header directory (the start-up build makes only the example's).
    assert any(flag in cmd for cmd in running.values()) or len(headers) == 2, (running, headers)


async def _pool_ready(pool, n: int) -> None:
    """Wait until n warm cpu workers are idle (one kind on a CPU: its calls are synchronous already, so verify's
    candidate needs no worker of its own kind, `Availability.sync_launch_env`)."""
    with anyio.fail_after(180):
        while sum(len(v) for (b, _), v in pool._idle.items() if b == "cpu") < n:
            await anyio.sleep(0.2)


async def test_warm_workers_serve_jobs(tmp_path, cpu_example, candidate):
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:  # the cpu kind is wanted once the probe is in
        await _pool_ready(pool, 1)
        result = await verify_against_reference(ctx, VerifyRequest(backend="cpu",
                                                                   reference_code=cpu_example["reference"],
                                                                   candidate_code=candidate("chatty"), trials=1,
                                                                   use_store=False))
        assert result.correct, str(result)
        assert pool.served == 2  # the judge and the candidate both came warm (the second waited for a fork)
        # The judge's take left the kind short of two idle workers (a profile's takes), the candidate's missed: the
        # pool keeps three now, and refilled behind the job.
        plain = ("cpu", ())
        assert pool._target[plain] == 3 and all(not env for b, env in pool._target if b == "cpu")
        await _pool_ready(pool, 3)
        # Four jobs at once find three workers: the miss keeps one more (up to 4x the size; a take that leaves it
        # short raises it no further than one over the size).
        taken = [pool.take("cpu") for _ in range(3)]
        assert all(taken) and pool._target[plain] == 3
        assert pool.take("cpu") is None and pool._target[plain] == 4 and pool.max_size == 4
        for warm in taken:
            await kill_group(warm.proc)
            await warm.proc.aclose()
        await _pool_ready(pool, 4)
        assert len(pool._idle[plain]) == 4


async def test_a_job_that_finds_no_idle_worker_waits_for_a_fork(tmp_path, cpu_example, candidate):
    """A fork is ready sooner than a cold worker and has paid its first-use costs: jobs wait for one."""
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        await _pool_ready(pool, 1)
        taken = [pool.take("cpu")]  # nothing idle now
        assert all(taken) and pool.served == 1
        for warm in taken:
            await kill_group(warm.proc)
            await warm.proc.aclose()
        result = await verify_against_reference(ctx, VerifyRequest(backend="cpu",
                                                                   reference_code=cpu_example["reference"],
                                                                   candidate_code=candidate("chatty"), trials=1,
                                                                   use_store=False))
        assert result.correct, str(result)
        assert pool.served == 3  # the judge and the candidate waited for forks instead of starting cold


@pytest.mark.parametrize("name, kind, says", [("segfault", "crashed", "SIGSEGV"), ("hard_exit", "exited", "code 3")])
async def test_forked_worker_death_is_reported_as_for_a_cold_one(tmp_path, cpu_example, candidate, name, kind, says):
    """A warm worker is forked by the zygote, not started by the server: how it ended still reaches the result."""
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(2) as pool:  # one cpu kind: two idle serve the judge and the candidate
        await _pool_ready(pool, 2)
        result = await verify_against_reference(ctx, VerifyRequest(backend="cpu",
                                                                   reference_code=cpu_example["reference"],
                                                                   candidate_code=candidate(name), trials=1,
                                                                   use_store=False))
        assert pool.served == 2
        assert result.failure is not None and result.failure.kind == kind, str(result)
        assert says in result.failure.message
        await _pool_ready(pool, 2)  # the zygote outlives its workers' crashes


def test_a_header_build_marker_is_stale_once_its_builder_is_gone(tmp_path):
    """The marker that says "a precompiled header is being built" names its builder; a marker whose builder
    died (killed with a stopped server's machine, say) no longer blocks the next build for the full timeout."""
    import subprocess

    from kforge.backends.build.fast_build import builder_gone

    marker = tmp_path / "building"
    assert not builder_gone(marker)  # none
    marker.write_text("")
    assert not builder_gone(marker)  # just created, no process id yet
    alive = subprocess.Popen(["sleep", "30"])
    try:
        marker.write_text(f"{alive.pid}\n")
        assert not builder_gone(marker)
    finally:
        alive.kill()
        alive.wait()
    assert builder_gone(marker)
