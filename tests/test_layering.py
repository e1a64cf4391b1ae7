"""The house's arrows point down only (design.md, "The house"), read from every module's imports.

backends import nothing above them; profilers import only backends (and resources' data); tools never import the
server. Function-level imports count too: a lazy import is still an arrow. Server-side modules (tools/*.py, tools/process/,
server/) never import torch (the server process never starts a device, and starts fast), nor the harness, which
runs in workers. In the harness, torch is imported at the top of a module like in any torch code, except in the
modules a worker runs before torch (its bootstrap: `HARNESS_BEFORE_TORCH`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
LAYERS = ("backends", "profilers", "tools", "server", "resources")
# What each layer must not import.
FORBIDDEN = {
    "backends": {"profilers", "tools", "server"},
    "profilers": {"tools", "server"},
    "tools": {"server"},
    "resources": {"backends", "profilers", "tools", "server"},
}


def _modules(layer: str) -> list[Path]:
    return sorted(p for p in (ROOT / layer).rglob("*.py") if "__pycache__" not in p.parts)


def _dotted(path: Path) -> list[str]:
    """kforge.<layer>.<...> of a file, as parts (a package's __init__ is the package)."""
    parts = ["kforge", *path.relative_to(ROOT).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path, package: list[str] | None = None) -> list[tuple[str, int, bool]]:
    """(absolute module imported, line, at module level) for every import in `path` (of package `package`, by
    default the one its place in the repository says)."""
    tree = ast.parse(path.read_text(), str(path))
    if package is None:
        package = _dotted(path) if path.name == "__init__.py" else _dotted(path)[:-1]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[: len(package) - child.level + 1]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                # Each name under its module: `from . import sandbox` and `from kforge.tools import harness` import a
                # module of that name; `from ..models import X` is models' X (the checks read module prefixes).
                found.extend((f"{module}.{alias.name}", child.lineno, top) for alias in child.names)
            visit(child, inner)

    visit(tree, True)
    return found


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "kforge" and parts[1] in LAYERS else None


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_arrow_points_up(layer):
    wrong = []
    for path in _modules(layer):
        for module, line, _ in _imports(path):
            if _layer_of(module) in FORBIDDEN[layer]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "arrows pointing up:\n" + "\n".join(wrong)


def _server_side() -> list[Path]:
    tools = [p for p in (ROOT / "tools").glob("*.py")]
    return sorted(tools + _modules("tools/process") + _modules("server"))


def _is_torch(module: str) -> bool:
    return module == "torch" or module.startswith("torch.")


def test_server_side_modules_import_neither_torch_nor_the_harness():
    wrong = []
    for path in _server_side():
        for module, line, top in _imports(path):
            if _is_torch(module) or module.startswith("kforge.tools.harness"):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}" + ("" if top else " (in a function)"))
    assert not wrong, "\n".join(wrong)


# The harness modules a worker imports before torch: it enters its sandbox and network namespace while it has one
# thread, the fork server sets its backend's guard first, and a probe works where torch cannot be imported.
HARNESS_BEFORE_TORCH = {"worker", "session", "handoff", "forkserver", "__init__"}


# torch's modules a harness module may import in a function: Inductor, at a job's first torch.compile (a GPU zygote
# preloads it, `_nvidia.preload_gpu_compiler`; a CPU worker that never compiles should not pay its import).
LAZY_TORCH = {"torch._inductor.compile_fx"}


def test_the_harness_imports_torch_at_the_top_except_in_its_bootstrap():
    wrong = []
    for path in _modules("tools/harness"):
        found = [(line, top) for module, line, top in _imports(path) if _is_torch(module)
                 and not (module in LAZY_TORCH and not top)]
        for line, top in found:
            if path.stem in HARNESS_BEFORE_TORCH and top:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: the worker imports this module before torch")
            elif path.stem not in HARNESS_BEFORE_TORCH and not top:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: import torch at the top of the module")
    assert not wrong, "\n".join(wrong)


def test_a_worker_module_and_its_bootstrap_load_without_torch():
    """What `HARNESS_BEFORE_TORCH` promises, in a fresh interpreter: importing the worker's entry module (and so its
    bootstrap) does not import torch."""
    code = ("import sys; import kforge.tools.harness.worker as w; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('kforge')); "
            "assert w.role_class('probe') is w.Host")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_import_reader_sees_relative_and_lazy_imports(tmp_path):
    """The reader itself: relative imports resolve against their package, and an import in a function is an arrow
    too, though not one at module level."""
    sample = tmp_path / "sample.py"
    sample.write_text("import torch\nfrom ..models import Failure\nfrom . import sandbox\n"
                      "from kforge.server import app\n\n\ndef later():\n    from kforge.tools import harness\n"
                      "    from torch.utils import cpp_extension\n")
    found = _imports(sample, ["kforge", "tools", "process"])
    assert found == [("torch", 1, True), ("kforge.tools.models.Failure", 2, True),
                     ("kforge.tools.process.sandbox", 3, True), ("kforge.server.app", 4, True),
                     ("kforge.tools.harness", 8, False), ("torch.utils.cpp_extension", 9, False)]


def _module_graph() -> dict[str, set[str]]:
    """Each kforge module (backends, profilers, tools, server) and the kforge modules it imports: lazy imports and
    TYPE_CHECKING ones too, a package's __init__ not counted (it imports nothing here)."""
    mods = {".".join(_dotted(p)): p for layer in ("backends", "profilers", "tools", "server") for p in _modules(layer)}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for imported, _, _ in _imports(path):
            parts = imported.split(".")
            while parts and ".".join(parts) not in mods:
                parts.pop()  # `from kforge.tools.process.runner import WorkerProcess`: the module runner
            target = ".".join(parts)
            if parts and target != module and mods[target].name != "__init__.py":
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a circle (strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_two_modules_import_each_other():
    """A module that imports one that imports it back is one module in two files: the pool and the runner did
    (issue 18), the requests and the tools they ran, the tool context and the GPUs, the header build and the
    builder."""
    assert _cycles(_module_graph()) == []


def test_the_cycle_reader_finds_a_circle_and_only_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
