"""Build capture for `load_inline`: the stand-in a worker installs while user code imports (runs in workers only).

Every `torch.utils.cpp_extension.load_inline` call the candidate makes goes through `InlineBuilder`, which

* puts each build in a content-addressed directory of the shared build cache (same sources, flags
  and toolchain -> same directory, so a repeated candidate is ready without compiling);
* in a sandboxed worker the shared cache is read-only: a build the cache lacks is asked of the server
  (`build_request`), which builds it in a sandbox of its own and promotes the library into the cache
  under the key it computed itself, before the candidate may load it (`kforge.tools.process.build_service`);
* adds the backend's default flags (OpenMP on CPU, the present GPU's arch on CUDA);
* captures the compiler's output and turns it into located diagnostics, ptxas' kernel resources and the
  vectorizer's report.

It is C++/CUDA build machinery, so it lives with the backends that use it (`Backend.capture_builds` installs it);
the worker's loader (`kforge.tools.harness.loader`) only runs the candidate's import inside it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from .compiler_report import VEC_REPORT_FILE, CompilerReport, imported_math, loop_remarks, parse_vectorizer_remarks, widest_vector_bytes
from .cuda_split import SplitDeclined, split_cuda_sources
from .diagnostics import SourceMap, parse_compiler_output, parse_ptxas_resources
from .fast_build import MAX_ANSWER_BYTES, build_key, lean_cuda_sources, main_cpp_flags, mark_used, pch_dir_for, pch_key
from .models import BuildInfo, Diagnostic, KernelResources

__all__ = ["BuildError", "InlineBuilder", "ServedBuild", "read_served_build", "sweep_abandoned_builds", "tail"]

_TAIL_LINES = 30
# A private build directory untouched this long belongs to a killed build (builds write as they go, and a
# worker step's deadline is 10 minutes by default).
_ABANDONED_BUILD_S = 6 * 3600
# Compiler errors that a lean-header build blames on a name only the full torch/extension.h declares.
_LEAN_HEADER_TO_BLAME = re.compile(r'namespace "(torch|at|c10|py|pybind11)[^"]*" has no member|'
                                   r'identifier "(py|pybind11|torch|at|c10|TORCH_|AT_|C10_)[^"]*" is undefined|'
                                   r"'(py|pybind11|torch|at|c10)' (has not been declared|is not a namespace)|"
                                   r"is not a member of '(torch|at|c10|pybind11)")


def tail(text: str, n: int = _TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _built_library_exists(build_dir: Path, name: str) -> bool:
    return any(build_dir.glob(f"{name}*.so")) or any(build_dir.glob(f"{name}*.pyd"))


def sweep_abandoned_builds(cache_dir: Path, older_than_s: float = _ABANDONED_BUILD_S) -> list[Path]:
    """Remove private build directories that no build has touched for `older_than_s` (their worker was killed)."""
    removed = []
    now = time.time()
    for d in cache_dir.glob(".building-*"):
        try:
            if now - d.stat().st_mtime > older_than_s:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
        except OSError:
            continue
    return removed


def _import_built(name: str, build_dir: Path, is_python_module: bool) -> Any:
    """Load a finished build without torch's build step (no ninja, no file writes): a cache hit."""
    from torch.utils import cpp_extension

    return cpp_extension._import_module_from_library(name, str(build_dir), is_python_module)


@contextmanager
def _fd_capture(path: Path) -> Iterator[None]:
    """Point fds 1 and 2 at `path` (compiler output from ninja's subprocesses lands there)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


class BuildError(Exception):
    """Raised out of the candidate's import when one of its builds failed."""

    def __init__(self, name: str, diagnostics: list[Diagnostic], output: str) -> None:
        super().__init__(f"build of extension '{name}' failed")
        self.name, self.diagnostics, self.output = name, diagnostics, output


class InlineBuilder:
    """The `load_inline` stand-in installed while user code imports.

    A build lives in the cache under its content address (`fast_build.build_key`). A hit loads the
    library directly. A miss builds in a private directory and publishes it with one rename, so
    concurrent workers never see half a build and a killed build leaves nothing behind.
    """

    def __init__(self, original: Any, *, candidate_text: str, cache_dir: Path, backend: Any,
                 precompiled_headers: bool = False, pch_requests: list[list[str]] | None = None,
                 build_request: Any = None, build_root: Path | None = None) -> None:
        self.original = original
        self.pch_requests = pch_requests
        self.cache_dir = cache_dir
        self.build_request = build_request  # the server's builds (a sandboxed worker: the cache is read-only)
        self.build_root = build_root or cache_dir  # where private build directories go
        self.last_mode = "plain"  # the form of the last build tried (`_build`'s mode), and its directory
        self.last_build_dir: Path | None = None
        self.keep_failed_builds = False  # the server's builder: its whole staging directory goes afterwards
        self.backend = backend
        self.precompiled_headers = precompiled_headers
        self.source_map = SourceMap(candidate_text)
        self.builds: list[BuildInfo] = []
        self.diagnostics: list[Diagnostic] = []
        self.extensions: list[ModuleType] = []
        self._not_split: str | None = None  # why the build in progress is not split (BuildInfo.not_split)

    def __call__(self, name: str, cpp_sources: Any, cuda_sources: Any = None, functions: Any = None, **kwargs: Any) -> Any:
        kwargs.update(name=name, cpp_sources=_as_list(cpp_sources), cuda_sources=_as_list(cuda_sources), functions=functions)
        for flag_kind, defaults in self.backend.build_defaults().items():
            have = list(kwargs.get(flag_kind) or [])
            kwargs[flag_kind] = have + [f for f in defaults if f not in have]
        fn_names = list(functions) if isinstance(functions, dict) else _as_list(functions)
        final = self.cache_dir / f"{name}-{build_key(kwargs, self.backend.name)}"
        t0 = time.perf_counter()
        if _built_library_exists(final, name):
            module = _import_built(name, final, kwargs.get("is_python_module", True))
            mark_used(final)  # `kforge prune` removes the least recently used builds first
            if self.precompiled_headers:  # e.g. the header build of an earlier run was killed with its server
                pch_dir, ready = pch_dir_for(self.cache_dir, kwargs)
                if not ready:
                    self._start_pch(pch_dir, final, name)
            return self._built(module, BuildInfo(name=name, ok=True, seconds=time.perf_counter() - t0, from_cache=True,
                                                 functions=fn_names, kernels=self._kernel_resources("", final),
                                                 compiler_report=self._compiler_report(name, kwargs, final)))
        if self.build_request is not None:
            return self._built_by_server(name, kwargs, fn_names, t0)
        sweep_abandoned_builds(self.build_root)
        module, build_dir, how = self._build(name, kwargs)
        try:
            os.rename(build_dir, final)  # publish; the library stays loaded from its old path
            build_dir = final
        except OSError:  # another worker published the same build first: keep theirs
            shutil.rmtree(build_dir, ignore_errors=True)
            build_dir = final
        info = BuildInfo(name=name, ok=True, seconds=time.perf_counter() - t0, from_cache=False, functions=fn_names,
                         kernels=self._kernel_resources("", build_dir), fast_paths=how, not_split=self._pop_not_split(),
                         compiler_report=self._compiler_report(name, kwargs, build_dir))
        if self.precompiled_headers and "precompiled header" not in how:
            pch_dir, _ = pch_dir_for(self.cache_dir, kwargs)
            self._start_pch(pch_dir, build_dir, name)  # the next build with these flags uses it
        return self._built(module, info)

    def _built_by_server(self, name: str, kwargs: dict[str, Any], fn_names: list[str], t0: float) -> Any:
        """A build the read-only cache lacks, made by the server and promoted into the cache (issue 17): this
        process never writes there, so no job can leave anything in the cache for the next one."""
        why = "a standalone program" if kwargs.get("is_standalone") else ""
        try:
            request = json.loads(json.dumps({"kwargs": kwargs, "backend": self.backend.name,
                                             "arch": os.environ.get("TORCH_CUDA_ARCH_LIST", "")}))
        except (TypeError, ValueError):  # arguments that are not plain data: built here, privately
            request, why = None, why or "its arguments are not plain data"
        answer = self.build_request(request) if request is not None and not why else None
        if not isinstance(answer, dict) or answer.get("declined"):
            why = why or (answer.get("declined") if isinstance(answer, dict) else "the server did not answer")
            print(f"kforge: build of {name} not shared ({why}); built in the job's own directory", file=sys.stderr)
            self.build_root = Path(os.environ.get("TMPDIR") or ".") / "builds"
            self.build_root.mkdir(parents=True, exist_ok=True)
            module, build_dir, how = self._build(name, kwargs)
            return self._built(module, BuildInfo(
                name=name, ok=True, seconds=time.perf_counter() - t0, from_cache=False, functions=fn_names,
                kernels=self._kernel_resources("", build_dir), fast_paths=how, not_split=self._pop_not_split(),
                compiler_report=self._compiler_report(name, kwargs, build_dir)))
        mode = answer.get("mode") if answer.get("mode") in ("split", "lean", "plain") else "plain"
        _, mapping, _, _ = self._prepare(name, kwargs, mode)
        # The files the compiler saw, as the server's builder wrote them (its directory is out of reach here):
        # copies in this job's directory locate the compiler's messages in the candidate.
        built_in = Path(tempfile.mkdtemp(prefix=f"kforge-build-{name}-"))
        generated = answer.get("generated") if isinstance(answer.get("generated"), dict) else {}
        for file_name in ("main.cpp", "cuda.cu"):
            if isinstance(generated.get(file_name), str):
                (built_in / file_name).write_text(generated[file_name])
        not_split = answer.get("not_split") if isinstance(answer.get("not_split"), str) else None
        if not answer.get("ok"):
            output = str(answer.get("output") or "the build failed")
            diags = self._diagnostics(output, built_in, mapping)
            self.builds.append(BuildInfo(name=name, ok=False, seconds=time.perf_counter() - t0, from_cache=False,
                                         functions=fn_names, not_split=not_split))
            self.diagnostics.extend(diags)
            raise BuildError(name, diags, output)
        final = Path(answer["dir"])
        if final.parent != self.cache_dir:
            raise RuntimeError(f"the server's build of {name} is not in the build cache: {final}")
        module = _import_built(name, final, kwargs.get("is_python_module", True))
        log = final / "kforge-build.log"
        output = log.read_text(errors="replace") if log.exists() else ""
        self.diagnostics.extend(d for d in self._diagnostics(output, built_in, mapping) if d.severity == "warning")
        how = [h for h in answer.get("how") or [] if isinstance(h, str)]
        return self._built(module, BuildInfo(
            name=name, ok=True, seconds=time.perf_counter() - t0, from_cache=False, functions=fn_names,
            kernels=self._kernel_resources("", final), fast_paths=how, not_split=not_split,
            compiler_report=self._compiler_report(name, kwargs, final)))

    def _start_pch(self, pch_dir: Path, build_dir: Path, name: str) -> None:
        # The server starts the header builds a worker wants, ending with it (`build_service.spawn_pch_build`): a build the
        # worker started would die with its sandbox, or outlive the server without one (issue 17).
        if self.pch_requests is not None and [str(pch_dir), str(build_dir)] not in self.pch_requests:
            self.pch_requests.append([str(pch_dir), str(build_dir)])

    def _built(self, module: Any, info: BuildInfo) -> Any:
        self.builds.append(info)
        self.extensions.append(module)
        return module

    def _build(self, name: str, kwargs: dict[str, Any], *, mode: str = "split") -> tuple[Any, Path, list[str]]:
        """Build in a private directory, trying the fastest form first.

        `mode`: "split" (kernels in a torch-free .cu, wrappers in the C++ file), "lean" (torch/types.h
        for torch/extension.h in the .cu) or "plain". A split that fails is rebuilt lean, and a lean
        build that failed for want of the full header is rebuilt plain: a fast path may cost time,
        never a build the candidate's own form would not give.
        """
        build_dir = self.build_root / f".building-{name}-{uuid.uuid4().hex[:12]}"
        build_dir.mkdir(parents=True)
        build, mapping, how, mode = self._prepare(name, kwargs, mode)
        self.last_mode, self.last_build_dir = mode, build_dir
        capture = build_dir / "kforge-build.log"
        t0 = time.perf_counter()
        try:
            with _fd_capture(capture):
                module = self.original(**{**build, "build_directory": str(build_dir), "verbose": True})
        except Exception as exc:
            output = (capture.read_text(errors="replace") if capture.exists() else "") + "\n" + str(exc)
            retry = {"split": "lean", "lean": "plain" if _LEAN_HEADER_TO_BLAME.search(output) else None}.get(mode)
            if retry is not None:
                if mode == "split":
                    self._not_split = "the split sources did not compile (the unsplit build's messages are the ones reported)"
                shutil.rmtree(build_dir, ignore_errors=True)
                return self._build(name, kwargs, mode=retry)
            diags = self._diagnostics(output, build_dir, mapping)
            self.builds.append(BuildInfo(name=name, ok=False, seconds=time.perf_counter() - t0, from_cache=False,
                                         functions=_as_list(kwargs["functions"]) if not isinstance(kwargs["functions"], dict)
                                         else list(kwargs["functions"]), not_split=self._pop_not_split()))
            self.diagnostics.extend(diags)
            if not self.keep_failed_builds:
                shutil.rmtree(build_dir, ignore_errors=True)
            raise BuildError(name, diags, output) from exc
        output = capture.read_text(errors="replace") if capture.exists() else ""
        self.diagnostics.extend(d for d in self._diagnostics(output, build_dir, mapping) if d.severity == "warning")
        self._kernel_resources(output, build_dir)
        return module, build_dir, how

    def _prepare(self, name: str, kwargs: dict[str, Any], mode: str) -> tuple[dict[str, Any], dict[str, Any], list[str], str]:
        """The arguments a build of this form passes to `load_inline`, the map from the files it writes to the
        candidate's pieces, the fast paths it takes, and the form it ends up in."""
        build = dict(kwargs)
        how: list[str] = []
        mode = mode if build["cuda_sources"] else "plain"
        mapping = {"main.cpp": (kwargs["cpp_sources"], kwargs["cpp_sources"]),
                   "cuda.cu": (kwargs["cuda_sources"], kwargs["cuda_sources"])}
        if mode == "split":
            try:
                split = split_cuda_sources(build["cuda_sources"])
            except SplitDeclined as why:
                self._not_split = str(why)
                mode = "lean"
            else:
                first = [] if build.get("no_implicit_headers") else ["#include <torch/extension.h>"]
                build.update(cpp_sources=first + build["cpp_sources"] + split.cpp, cuda_sources=split.cuda,
                             no_implicit_headers=True)
                mapping = {"main.cpp": (build["cpp_sources"], first + kwargs["cpp_sources"] + split.cpp_written),
                           "cuda.cu": (split.cuda, split.cuda_written)}
                how.append("kernels split from torch wrappers")
        if mode == "lean":
            build["cuda_sources"], swapped = lean_cuda_sources(build["cuda_sources"])
            mode = "lean" if swapped else "plain"
            mapping["cuda.cu"] = (build["cuda_sources"], kwargs["cuda_sources"])
            how += ["lean CUDA header (torch/types.h)"] if swapped else []
        if self.precompiled_headers:
            pch_dir, ready = pch_dir_for(self.cache_dir, kwargs)
            if ready:
                mark_used(pch_dir)
                build["extra_include_paths"] = [str(pch_dir), *(build.get("extra_include_paths") or [])]
                how.append("precompiled header")
        return build, mapping, how, mode

    def _pop_not_split(self) -> str | None:
        why, self._not_split = self._not_split, None
        return why

    @staticmethod
    def _kernel_resources(output: str, build_dir: Path) -> list[KernelResources]:
        """ptxas' report of a fresh build, kept beside the build so a cache hit reports it too."""
        saved = build_dir / "kforge-kernels.json"
        kernels = parse_ptxas_resources(output)
        if kernels:
            saved.write_text(json.dumps([k.model_dump(mode="json") for k in kernels]))
        elif saved.exists():
            kernels = [KernelResources(**k) for k in json.loads(saved.read_text())]
        return kernels

    def _compiler_report(self, name: str, kwargs: dict[str, Any], build_dir: Path) -> CompilerReport | None:
        """The vectorizer's remarks on the candidate's own lines, and the math calls the library imports.

        Read from the files the build left (the report GCC wrote, the build log with clang's remarks), so a
        cache hit reports them too; lines are mapped into the candidate each time (its other lines may move).
        """
        texts = [p.read_text(errors="replace") for p in (build_dir / VEC_REPORT_FILE, build_dir / "kforge-build.log")
                 if p.exists()]
        remarks, blocking = parse_vectorizer_remarks("\n".join(texts))
        if not remarks:
            return None  # the backend asked for no report (CUDA builds), or the compiler gave none
        if kwargs.get("cpp_sources"):
            self.source_map.add_generated_file(build_dir / "main.cpp", kwargs["cpp_sources"])
        located = []
        for r in remarks:
            if Path(r.file).name not in ("main.cpp", "cuda.cu"):
                continue  # torch's and the standard library's headers
            line = self.source_map.candidate_line(r.file, r.line, _read_generated(build_dir, r.file, r.line))
            if line is not None:
                located.append((line, f"{Path(r.file).name}:{r.line}", r))
        library = next(iter(sorted(build_dir.glob(f"{name}*.so"))), None)
        scalar, vector = imported_math(library) if library is not None else ([], [])
        compiler = "gcc" if (build_dir / VEC_REPORT_FILE).exists() else "clang"  # GCC's report is a file
        return CompilerReport(build=name, compiler=compiler, loops=loop_remarks(located),
                              scalar_math=scalar, vector_math=vector, blocking_calls=blocking,
                              host_vector_bytes=widest_vector_bytes())

    def _diagnostics(self, output: str, build_dir: Path, mapping: dict[str, tuple[list[str], list[str]]]) -> list[Diagnostic]:
        """Compiler messages located in the candidate; `mapping`: file -> (pieces as built, as the candidate wrote them)."""
        for file_name, (built, written) in mapping.items():
            if built:
                self.source_map.add_generated_file(build_dir / file_name, built, written)
        return parse_compiler_output(output, self.source_map, build_dir=build_dir, source="c++")


def _read_generated(build_dir: Path, file_name: str, line: int) -> str | None:
    try:
        lines = (build_dir / Path(file_name).name).read_text(errors="replace").splitlines()
    except OSError:
        return None
    return lines[line - 1] if 0 < line <= len(lines) else None


def _serve_build(request_file: Path, out: Path) -> None:
    """The server's builder (in a sandbox of its own, no candidate code in it): build the request's extension
    in `out` without loading it, and say on stdout what the server needs, the key before anything compiles."""
    import ctypes

    trusted = os.fdopen(os.dup(1), "w")  # close-on-exec: no compiler this starts inherits it
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no process it starts may open its memory or fds

    def say(item: dict[str, Any]) -> None:
        trusted.write(json.dumps(item) + "\n")
        trusted.flush()

    request = json.loads(request_file.read_text())
    kwargs = request["kwargs"]
    if request.get("arch"):
        os.environ["TORCH_CUDA_ARCH_LIST"] = request["arch"]
    say({"key": build_key(kwargs, request["backend"]), "pch_key": pch_key(kwargs)})

    from torch.utils import cpp_extension

    run_ninja = cpp_extension._run_ninja_build

    def recorded_ninja(build_directory: str, *args: Any, **kw: Any) -> Any:
        # build.ninja as torch wrote it, before ninja starts any compiler: main.cpp's command for the header build
        say({"ninja": Path(build_directory).name, "cmd": main_cpp_flags(Path(build_directory) / "build.ninja")})
        return run_ninja(build_directory, *args, **kw)

    cpp_extension._run_ninja_build = recorded_ninja
    cpp_extension._import_module_from_library = lambda *a, **k: None  # built, never loaded here

    class _Backend:
        name = request["backend"]

    builder = InlineBuilder(cpp_extension.load_inline, candidate_text="", cache_dir=Path(request["cache_dir"]),
                             backend=_Backend(), precompiled_headers=bool(request.get("precompiled_headers")),
                             build_root=out)
    builder.keep_failed_builds = True

    def generated() -> dict[str, str]:  # the sources as the compiler saw them: the worker locates messages in them
        where = builder.last_build_dir
        return {f: (where / f).read_text(errors="replace")[:MAX_ANSWER_BYTES // 4]
                for f in ("main.cpp", "cuda.cu") if where is not None and (where / f).is_file()}

    try:
        _, build_dir, how = builder._build(kwargs["name"], kwargs)
    except BuildError as exc:
        say({"done": True, "ok": False, "output": exc.output[-MAX_ANSWER_BYTES // 4:], "mode": builder.last_mode,
             "not_split": builder._pop_not_split(), "generated": generated(),
             "build_dir": builder.last_build_dir.name if builder.last_build_dir else None})
        return
    say({"done": True, "ok": True, "build_dir": build_dir.name, "how": how, "mode": builder.last_mode,
         "not_split": builder._pop_not_split(), "generated": generated()})


@dataclass(frozen=True)
class ServedBuild:
    """What the server's builder (`_serve_build`) said on its trusted stdout: the keys it builds under, computed
    before any compiler ran; its last line (`done`: ok, how, mode, output, build_dir, ...); and main.cpp's compile
    command of each build directory that ninja ran (what a precompiled header is built with)."""

    key: str
    pch_key: str
    done: dict[str, Any]
    main_cpp_commands: dict[str, Any]


def read_served_build(data: bytes) -> ServedBuild | None:
    """`_serve_build`'s answer from its stdout, or None where it did not name its keys or did not finish."""
    lines = []
    for line in data.decode(errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            lines.append(item)
    head = lines[0] if lines else {}
    done = next((x for x in lines if "done" in x), None)
    key, header = head.get("key"), head.get("pch_key")
    if done is None or not all(isinstance(k, str) and re.fullmatch(r"[0-9a-f]{20}", k) for k in (key, header)):
        return None
    return ServedBuild(key, header, done, {x["ninja"]: x.get("cmd") for x in lines if isinstance(x.get("ninja"), str)})


if __name__ == "__main__":  # the server's build of a worker's request, inside its sandbox: --build REQUEST OUT
    if sys.argv[1:2] == ["--build"]:
        _serve_build(Path(sys.argv[2]), Path(sys.argv[3]))
