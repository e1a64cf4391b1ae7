"""The shared build cache is filled by the server, never by a worker (issue 17): a second job of the same
source is still a cache hit, and a candidate can neither write into the cache nor change a promoted build.
Real builds with a tiny pybind11-only source (seconds, not a torch-header build)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from kforge.tools.context import ToolContext
from kforge.tools.evaluate import compile_kernel
from kforge.tools.requests import CompileRequest
from kforge.backends.build.fast_build import promote_build
from kforge.tools.process.limits import WorkerLimits

pytestmark = pytest.mark.anyio

_TINY = '''
import os, json
from torch.utils.cpp_extension import load_inline
src = """
#include <pybind11/pybind11.h>
int f(int a) {{ return a * {factor}; }}
"""
ext = load_inline(name="kf_promoted", cpp_sources=src, functions=["f"], no_implicit_headers=True,
                  with_pytorch_error_handling=False)
assert ext.f(5) == 5 * {factor}, ext.f(5)
{attack}
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
'''

# After its own build: try to replace the promoted library, add files beside it and in the cache; report.
_ATTACK = '''
import errno
built = os.path.dirname(ext.__file__)
report = {"built": built}
for key, path, mode in (("so", ext.__file__, "wb"), ("beside", os.path.join(built, "note"), "w"),
                        ("builds", os.path.join(os.path.dirname(built), "kforge-note"), "w"),
                        ("cache", os.path.join(os.path.dirname(os.path.dirname(built)), "kforge-note"), "w"),
                        ("pch", os.path.join(os.path.dirname(os.path.dirname(built)), "pch", "kforge-note"), "w")):
    try:
        with open(path, mode) as f:
            f.write(b"poison" if "b" in mode else "note")
        report[key] = "SUCCEEDED"
    except OSError as exc:
        report[key] = "blocked: " + errno.errorcode.get(exc.errno, str(exc.errno))
raise RuntimeError("CACHE-REPORT " + json.dumps(report))
'''


def _code(factor: int, attack: str = "") -> str:
    return _TINY.format(factor=factor, attack=attack)


@pytest.fixture
def ctx(tmp_path) -> ToolContext:
    return ToolContext(home=tmp_path / "home", limits=WorkerLimits())


def _require_sandbox(ctx: ToolContext) -> None:
    if not ctx.limits.sandbox or sys.platform != "linux":
        pytest.skip("the sandbox is off")


async def test_a_second_job_hits_the_build_the_server_promoted(ctx):
    _require_sandbox(ctx)
    first = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=_code(3), use_store=False))
    assert first.ok, str(first)
    [built] = first.builds
    assert not built.from_cache
    [entry] = (ctx.home / "cache" / "builds").iterdir()
    assert entry.name.startswith("kf_promoted-") and (entry / "kf_promoted.so").is_file()
    assert (entry / "kforge-pch.json").is_file()  # the server's record, for the header build
    # Nothing but the expected files, and nothing left in the server's staging directory.
    assert {p.name for p in entry.iterdir()} <= {"kf_promoted.so", "main.cpp", "build.ninja", "kforge-build.log",
                                                 "kforge-pch.json", "kforge-kernels.json", "kforge-vec.txt"}
    assert not list((ctx.home / "staging").iterdir())
    again = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=_code(3), use_store=False))  # a new job, a new worker
    assert again.ok, str(again)
    [hit] = again.builds
    assert hit.from_cache and hit.seconds < 1.0, hit


async def test_a_candidate_cannot_write_the_shared_cache_nor_change_its_build(ctx):
    _require_sandbox(ctx)
    result = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=_code(7, _ATTACK), use_store=False))
    assert not result.ok
    message = result.failure.message
    assert "CACHE-REPORT " in message, message
    report = json.JSONDecoder().raw_decode(message.split("CACHE-REPORT ", 1)[1])[0]
    through = {k: v for k, v in report.items() if k != "built" and not v.startswith("blocked")}
    assert not through, report
    builds = ctx.home / "cache" / "builds"
    [entry] = builds.iterdir()
    assert Path(report["built"]).name == entry.name
    library = entry / "kf_promoted.so"
    assert b"poison" not in library.read_bytes()[:16]
    assert not list(ctx.home.joinpath("cache").rglob("*note*"))
    digest = hashlib.sha256(library.read_bytes()).hexdigest()
    honest = await compile_kernel(ctx, CompileRequest(backend="cpu", candidate_code=_code(7), use_store=False))  # same build: a hit, still correct
    assert honest.ok and honest.builds[0].from_cache, str(honest)
    assert hashlib.sha256(library.read_bytes()).hexdigest() == digest


def test_promotion_copies_only_the_expected_regular_files(tmp_path):
    built, cache = tmp_path / "built", tmp_path / "cache"
    built.mkdir()
    cache.mkdir()
    (built / "main.cpp").write_text("int f();")
    (built / "main.o").write_bytes(b"object")
    (built / "extra.so").write_bytes(b"another library")
    (tmp_path / "elsewhere.so").write_bytes(b"not the build's")
    os.symlink(tmp_path / "elsewhere.so", built / "ext.so")  # a link in place of the library: not promoted
    assert promote_build(cache, "ext", "0" * 20, built, {"pch_key": "1" * 20, "cmd": ["c++"]}) is None
    assert not list(cache.iterdir())
    (built / "ext.so").unlink()
    (built / "ext.so").write_bytes(b"the library")
    final = promote_build(cache, "ext", "0" * 20, built, {"pch_key": "1" * 20, "cmd": ["c++"]})
    assert final == cache / f"ext-{'0' * 20}"
    assert sorted(p.name for p in final.iterdir()) == ["ext.so", "kforge-pch.json", "main.cpp"]
    assert json.loads((final / "kforge-pch.json").read_text()) == {"pch_key": "1" * 20, "cmd": ["c++"]}
    assert [p.name for p in cache.iterdir()] == [final.name]  # no staging left beside it


def test_a_server_build_sees_a_gpu_only_for_cuda_sources_without_an_architecture():
    """The builder's sandbox opens no GPU device node unless torch must ask the GPUs which architecture to build for."""
    from kforge.backends.build.fast_build import build_needs_device

    assert build_needs_device({"cuda_sources": ["k.cu"]}, "")
    assert not build_needs_device({"cuda_sources": ["k.cu"]}, "9.0")
    assert not build_needs_device({"cpp_sources": ["k.cpp"]}, "")
