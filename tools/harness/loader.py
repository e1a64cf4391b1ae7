"""Load a candidate or reference module inside a worker, capturing every build it makes.

Runs only in worker processes. The user's source is written to a file (Triton and tracebacks need
real files) and imported as a module, inside its backend's build capture (`Backend.capture_builds`:
`load_inline` through `kforge.backends.build.inline.InlineBuilder` on every backend that builds C++,
NVRTC too on CUDA). What the import raises becomes a located `Failure`; the backend says which
errors are its kernel compiler's (`Backend.compile_error`) and which are device faults
(`Backend.fault_markers`).
"""

from __future__ import annotations

import errno
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from torch.utils import cpp_extension

from kforge.backends import is_device_fault, is_out_of_memory
from kforge.backends.build.inline import BuildError, InlineBuilder, sweep_abandoned_builds, tail

from ..models import BuildInfo, Diagnostic, Failure

__all__ = ["LoadOutcome", "load_user_module", "python_failure", "sweep_abandoned_builds"]

# The backend that loaded this worker's user module: `python_failure` asks it about later errors (a Triton kernel
# compiles at its first launch, long after the import).
_loaded_backend: Any = None


@dataclass
class LoadOutcome:
    module: ModuleType | None
    seconds: float
    builds: list[BuildInfo] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    failure: Failure | None = None
    #: extension modules built while loading, for the profiler's per-function labels
    extensions: list[ModuleType] = field(default_factory=list)


def _compile_failure(exc: BaseException, backend: Any, *, stage: str, user_file: Path) -> Failure | None:
    """A build_error Failure where the backend recognises `exc` as its kernel compiler's error, else None."""
    locate = getattr(backend, "compile_error", None)
    if locate is None:
        return None
    try:
        text = user_file.read_text()
    except OSError:
        text = ""
    diag = locate(exc, text)
    if diag is None:
        return None
    return Failure(stage=stage, kind="build_error", message=f"{diag.source.title()} could not compile the kernel: "
                   f"{diag.message}", line=diag.line, diagnostics=[diag],
                   traceback_tail=tail("".join(traceback.format_exception(exc))))


def _deepest_user_line(exc: BaseException, user_file: Path) -> int | None:
    """The deepest line of the user's file in the traceback, innermost cause first.

    Wrapped errors (Triton's InterpreterError around a NameError in the kernel body) carry the
    line that matters in their cause's traceback, not in the wrapper's.
    """
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for err in reversed(chain):
        if isinstance(err, SyntaxError) and err.filename == str(user_file):
            return err.lineno
        lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == str(user_file)]
        if lines:
            return lines[-1]
    return None


def python_failure(exc: BaseException, *, stage: str, user_file: Path, kind: str | None = None,
                   backend: Any = None) -> Failure:
    """A Failure for a Python exception, pointing at the deepest frame in the user's file. `backend` (by default
    the one that loaded the user's module) says which errors are its compiler's and which are device faults."""
    backend = backend if backend is not None else _loaded_backend
    if kind is None and (compiled := _compile_failure(exc, backend, stage=stage, user_file=user_file)) is not None:
        return compiled
    line = _deepest_user_line(exc, user_file)
    text = str(exc)
    if kind is None:
        kind = ("device_fault" if is_device_fault(text, backend)
                else "syntax_error" if isinstance(exc, SyntaxError)
                else "out_of_memory" if isinstance(exc, MemoryError) or is_out_of_memory(text)
                else "import_error" if isinstance(exc, ImportError) else "exception")
    message = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        import resource

        kind = "resource_limit"
        message += (f" (this worker may hold {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} open file descriptors, "
                    "RLIMIT_NOFILE: the candidate opened files, sockets or pipes and did not close them)")
    elif (isinstance(exc, OSError) and exc.errno == errno.EAGAIN) or "can't start new thread" in text:
        if (limit := _task_limit()) is not None:
            kind = "resource_limit"
            message += (f" (this worker may run {limit} processes and threads at once, its PID namespace's pid_max: "
                        "KFORGE_WORKER_MAX_TASKS; the candidate started too many, or left them running)")
    tb = "".join(traceback.format_exception(exc))
    return Failure(stage=stage, kind=kind, message=message[:2000], line=line, traceback_tail=tail(tb))


def _task_limit() -> int | None:
    """The worker's cap on processes and threads (`kforge.tools.process.sandbox`), None where it has none of its own."""
    try:
        limit = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return None
    return limit if os.getpid() == 1 else None  # PID 1 of its own namespace: the sandbox set this pid_max


def load_user_module(source: str, *, path: Path, module_name: str, cache_dir: Path, backend: Any,
                     precompiled_headers: bool = False, pch_requests: list[list[str]] | None = None,
                     build_request: Any = None) -> LoadOutcome:
    """Import `source` as module `module_name` from file `path`, building its extensions. With `pch_requests`
    (a sandboxed worker), the header builds it wants are appended there for the server to start; with
    `build_request` (the cache is read-only here), a build the cache lacks is asked of the server through it.

    Never raises for problems in the user's code: they come back as `LoadOutcome.failure`.
    """
    path.write_text(source)
    t0 = time.perf_counter()
    try:
        code = compile(source, str(path), "exec")
    except SyntaxError as exc:
        return LoadOutcome(None, time.perf_counter() - t0, failure=Failure(
            stage="load", kind="syntax_error", message=f"SyntaxError: {exc.msg}", line=exc.lineno,
            diagnostics=[Diagnostic(severity="error", message=exc.msg, line=exc.lineno, column=exc.offset,
                                    source="python", code_line=(exc.text or "").rstrip() or None)]))

    global _loaded_backend
    _loaded_backend = backend
    builder = InlineBuilder(cpp_extension.load_inline, candidate_text=source, cache_dir=cache_dir, backend=backend,
                            pch_requests=pch_requests, build_request=build_request,
                            precompiled_headers=precompiled_headers)
    module = ModuleType(module_name)
    module.__file__ = str(path)
    sys.modules[module_name] = module
    try:
        with backend.capture_builds(builder):
            exec(code, module.__dict__)
    except BuildError as exc:
        errors = [d for d in exc.diagnostics if d.severity == "error"]
        first = errors[0] if errors else None
        return LoadOutcome(None, time.perf_counter() - t0, builder.builds, builder.diagnostics,
                           failure=Failure(stage="build", kind="build_error",
                                           message=str(first.message if first else exc),
                                           line=first.line if first else None, diagnostics=exc.diagnostics,
                                           output_tail=tail(exc.output, 40)),
                           extensions=builder.extensions)
    except BaseException as exc:  # noqa: BLE001 - anything the user's import raises is a result
        if isinstance(exc, KeyboardInterrupt):
            raise
        failure = python_failure(exc, stage="load", user_file=path, backend=backend)
        if isinstance(exc, SystemExit):
            failure = failure.model_copy(update={"kind": "exited", "message": f"the module called exit({exc.code})"})
        return LoadOutcome(None, time.perf_counter() - t0, builder.builds, builder.diagnostics, failure=failure,
                           extensions=builder.extensions)
    return LoadOutcome(module, time.perf_counter() - t0, builder.builds, builder.diagnostics,
                       extensions=builder.extensions)
