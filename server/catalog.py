"""Read-only data from `kforge.resources`: the problem pack, the per-backend examples, the format."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from kforge.backends import backend_names, example_dir
from kforge.tools.models import sha256_text

from .kernelbench import PREFIX as KERNELBENCH_PREFIX
from .kernelbench import KernelBench, KernelBenchError

__all__ = ["Problems", "UnknownProblem", "candidate_format", "example", "example_backends", "inline_build_examples", "problem_names",
           "problem_names_by_sha256", "problem_reference"]

_NAME = re.compile(r"^[a-z0-9_]+$")


def _root():
    return resources.files("kforge.resources")


def problem_names() -> list[str]:
    return sorted(p.name for p in (_root() / "problems").iterdir() if (p / "reference.py").is_file())


def problem_reference(name: str) -> str | None:
    if not _NAME.match(name):
        return None
    path = _root() / "problems" / name / "reference.py"
    return path.read_text() if path.is_file() else None


def problem_names_by_sha256() -> dict[str, str]:
    """{sha256 of a pack problem's reference text: its name} (results' specs carry the sha256)."""
    return {sha256_text(problem_reference(n) or ""): n for n in problem_names()}


class UnknownProblem(LookupError):
    """A `problem=` name that names nothing; the message lists what there is or says what to configure."""


class Problems:
    """The names `problem=` accepts: the server's pack, plus KernelBench's when a checkout is configured."""

    def __init__(self, kernelbench_dir: Path | None = None) -> None:
        self.kernelbench = KernelBench(kernelbench_dir)

    def names(self) -> list[str]:
        return problem_names() + self.kernelbench.names()

    def reference(self, name: str) -> str:
        """The reference source named `name`; UnknownProblem says why there is none."""
        if name.startswith(KERNELBENCH_PREFIX):
            try:
                return self.kernelbench.reference(name)
            except KernelBenchError as exc:
                raise UnknownProblem(str(exc)) from None
        code = problem_reference(name)
        if code is None:
            more = (f", and KernelBench's as '{KERNELBENCH_PREFIX}level1/23_Softmax'" if self.kernelbench.configured
                    else f" (KernelBench's too, as '{KERNELBENCH_PREFIX}level1/23_Softmax', once KFORGE_KERNELBENCH_DIR "
                         "names a checkout)")
            raise UnknownProblem(f"unknown problem {name!r}; the pack has: {', '.join(problem_names())}{more}")
        return code

    def by_sha256(self) -> dict[str, str]:
        """{sha256 of a problem's reference text: its name} (results' specs carry the sha256)."""
        found = {sha256_text(self.reference(n)): n for n in self.kernelbench.names()}
        return {**found, **problem_names_by_sha256()}


def _example_dir(backend: str) -> Path | None:
    """Where backend `backend` keeps its verified example: the backend says (`Backend.example_dir`), so a backend
    a package adds brings its own; None for a name no backend has, or a backend without one."""
    if not _NAME.match(backend):
        return None
    found = example_dir(backend)
    return found if found is not None and (found / "candidate.py").is_file() else None


def example_backends() -> list[str]:
    return [name for name in backend_names() if _example_dir(name) is not None]


def example(backend: str) -> dict[str, str] | None:
    base = _example_dir(backend)
    if base is None:
        return None
    # An example either carries its own reference or names a problem of the pack (problem.txt).
    if (base / "reference.py").is_file():
        reference = (base / "reference.py").read_text()
    else:
        reference = problem_reference((base / "problem.txt").read_text().strip()) or ""
    return {"reference": reference, "candidate": (base / "candidate.py").read_text()}


def inline_build_examples(backend: str) -> list[str]:
    """The texts of this backend's example candidates that build with `load_inline` (most candidates copy their flags)."""
    base = _example_dir(backend)
    if base is None:
        return []
    texts = [p.read_text() for p in sorted(base.iterdir(), key=lambda p: p.name)
             if p.name.startswith("candidate") and p.name.endswith(".py")]
    return [t for t in texts if "load_inline(" in t]


def candidate_format() -> str:
    return (_root() / "candidate_format.md").read_text()
