"""Each part of the house declares what it offers (`__all__`), and nobody reaches past that into another's privates.

The rule, read from the source of every module of `kforge` (tests/ and resources' data are not modules of it):

- Every module declares `__all__`, and every name in it exists. In a package's `__init__`, a name may also be one of
  the package's submodules: a package whose `__init__` holds no code of its own declares its public modules, so its
  listing is the map of what it offers.
- Each package's `__init__.__all__` is pinned below (`PACKAGES`): widening or narrowing a package's surface is a
  change made on purpose, here, in the same commit.
- Private means a leading underscore (dunders are not private): a private module (`backends/_nvidia.py`) or a private
  name in a module (`judge._memory_capacity`). A private thing is visible within its own package only: the package
  that holds the private module, or the package of the module that defines the private name, and that package's
  subpackages. So `backends/cuda.py` may import `backends/_nvidia.py` and `profilers/analyst/rules.py` may import
  `_passes`, but `tools/process/runner.py` may not import `kforge.backends._nvidia`, nor `tools/evaluate.py` a `_helper`
  of `tools/harness/judge.py`. A helper two packages need is public (no underscore) in the lower of the two
  (ARCHITECTURE.md). Both `from X import _name` and `X._name` on a name imported from kforge (a module, a class)
  count, at module level or inside a function; a private attribute of an object (`self._x`) is not an import.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

# Each package's declared surface. Change it here when a package's surface changes on purpose.
PACKAGES: dict[str, list[str]] = {
    "kforge": ["__version__"],
    "kforge.resources": ["templates"],
    "kforge.backends": ["OUT_OF_MEMORY_MESSAGES", "Availability", "Backend", "BackendBase", "DeviceFacts", "DeviceNodes",
                        "GpuInfo", "SharedOutput", "Timer", "backend_class", "backend_names", "device_nodes", "example_dir",
                        "fault_markers", "host_device_nodes", "import_backend_module", "is_device_fault",
                        "is_out_of_memory", "kernel_modules", "load_backend", "scan_rules", "toolchain_homes",
                        "worker_env_names"],
    "kforge.backends.build": ["compiler_report", "cuda_split", "diagnostics", "fast_build", "inline", "models",
                              "nvrtc"],
    "kforge.profilers": ["binary_report_suffixes", "load_profiler", "profiler_for", "profiler_names"],
    "kforge.profilers.analyst": ["Analysis", "AnalystProvider", "Bottleneck", "Evidence", "Recommendation",
                                 "RulesAnalyst", "load_provider", "parse_profile_text"],
    "kforge.server": ["app", "auth", "catalog", "cli", "clients", "compact", "http", "jsonrpc_errors", "kernelbench",
                      "pictures", "prewarm", "settings", "tool_params"],
    "kforge.tools": ["context", "device_use", "disk", "dispatch", "evaluate", "fleet", "fleet_node", "gpus", "harness", "jobs",
                     "models", "process", "profile", "requests", "rounds", "static_scan", "steps", "store", "summarize",
                     "tool_inputs", "trials", "verdict"],
    "kforge.tools.harness": ["bench", "candidate", "compare", "forkserver", "handoff", "inputs",
                             "integrity", "judge", "loader", "output_contract", "session", "timing", "worker"],
    "kforge.tools.process": ["build_service", "channel", "host_holds", "lifecycle", "limits", "pool", "profiled_launch",
                             "protocol", "runner", "sandbox"],
}


def _is_package(parts: list[str]) -> bool:
    return (ROOT.joinpath(*parts[1:]) / "__init__.py").is_file()


def _walk(parts: list[str]) -> list[str]:
    """Dotted names of the package `parts` and everything under it, found on disk (nothing is imported)."""
    found = [".".join(parts)]
    for info in pkgutil.iter_modules([str(ROOT.joinpath(*parts[1:]))]):
        child = [*parts, info.name]
        if child[:2] in (["kforge", "tests"],):
            continue
        found += _walk(child) if info.ispkg else [".".join(child)]
    return found


MODULES = sorted(_walk(["kforge"]))

def _path(module: str) -> Path:
    parts = module.split(".")[1:]
    base = ROOT.joinpath(*parts)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _declared(module: str) -> list[str] | None:
    """The module's `__all__` as written in its source (a literal list or tuple of strings), or None."""
    for node in ast.parse(_path(module).read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
            return list(ast.literal_eval(node.value))
    return None


def test_the_walk_finds_the_house():
    """The walk sees every layer and the subpackages, and leaves tests out."""
    for module in ("kforge.server.app", "kforge.tools.verdict", "kforge.tools.harness.judge",
                   "kforge.tools.process.protocol", "kforge.backends.base", "kforge.backends.build",
                   "kforge.profilers.analyst.rules", "kforge.resources.templates"):
        assert module in MODULES
    assert not [m for m in MODULES if m.startswith("kforge.tests")]


@pytest.mark.parametrize("module", MODULES)
def test_every_module_declares_its_public_names(module):
    declared = _declared(module)
    assert declared is not None, f"{_path(module).relative_to(ROOT)} declares no __all__"
    assert len(declared) == len(set(declared)), f"{module}.__all__ lists a name twice"
    mod = importlib.import_module(module)
    missing = [name for name in declared if not hasattr(mod, name)
               and not (_is_package(module.split(".")) and importlib.util.find_spec(f"{module}.{name}"))]
    assert not missing, f"{module}.__all__ names what it does not have: {missing}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_package_surface_is_pinned(package):
    assert _declared(package) == PACKAGES[package], (
        f"{package}.__all__ changed; if on purpose, update PACKAGES in {Path(__file__).name}")


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _scope_of_private(dotted: list[str]) -> list[str] | None:
    """The package a private thing named `dotted` (kforge.a.b...) is visible in, or None when nothing in it is
    private. For a private module, the package holding it; for a private name in a module, that module's package."""
    for i, part in enumerate(dotted):
        if i >= 1 and _is_private(part):
            holder = dotted[:i]
            while not _is_package(holder):  # a module, or a class in one: the package around it
                holder = holder[:-1]
            return holder
    return None


def _up_to_private(dotted: list[str]) -> str:
    """`dotted` cut after its first private part: what is being reached into."""
    for i, part in enumerate(dotted):
        if i >= 1 and _is_private(part):
            return ".".join(dotted[: i + 1])
    return ".".join(dotted)


def _private_uses(source: str, module: str) -> list[tuple[int, str]]:
    """(line, what) for every kforge name `module` imports, or reaches as an attribute of a name it imported from
    kforge (`judge._memory_capacity`, `Judge._snapshot`), where a private part lies outside `module`'s reach; `what`
    is the dotted name up to that part. Relative imports resolve against the module's package."""
    parts = module.split(".")
    package = parts if _is_package(parts) else parts[:-1]
    tree = ast.parse(source)
    names: dict[str, list[str]] = {}  # local name bound to a kforge module, class or function -> its dotted parts
    used: list[tuple[int, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name.split(".")
                if target[0] != "kforge":
                    continue
                used.append((node.lineno, target))
                if alias.asname:
                    names[alias.asname] = target
                else:
                    names["kforge"] = ["kforge"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            else:
                base = (node.module or "").split(".")
            if base[0] != "kforge":
                continue
            used.append((node.lineno, base))
            for alias in node.names:
                target = [*base, alias.name]
                used.append((node.lineno, target))
                names[alias.asname or alias.name] = target
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain: list[str] = []
            inner: ast.AST = node
            while isinstance(inner, ast.Attribute):
                chain.insert(0, inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in names:
                used.append((node.lineno, [*names[inner.id], *chain]))
    wrong = []
    for line, dotted in used:
        scope = _scope_of_private(dotted)
        if scope is not None and parts[: len(scope)] != scope:
            wrong.append((line, _up_to_private(dotted)))
    return sorted(set(wrong))


@pytest.mark.parametrize("module", MODULES)
def test_no_module_imports_another_packages_privates(module):
    wrong = _private_uses(_path(module).read_text(), module)
    where = _path(module).relative_to(ROOT)
    assert not wrong, "\n".join(f"{where}:{line} uses {name}, private to its own package" for line, name in wrong)


def test_the_private_reader_knows_the_rule():
    """Same package (and its subpackages): fine; another package: caught, as an import or as an attribute."""
    sample = ("from . import _nvidia\nfrom ._host import process_ids\nfrom kforge.backends.cuda import _arch\n"
              "from kforge.tools.harness import judge\nimport kforge.tools.harness.judge as j\n\n\n"
              "def later():\n    from ..tools.harness.judge import _memory_capacity\n"
              "    return judge._memory_capacity, j._snapshot, judge.Judge._private_method\n")
    assert _private_uses(sample, "kforge.backends.cpu") == [
        (9, "kforge.tools.harness.judge._memory_capacity"), (10, "kforge.tools.harness.judge.Judge._private_method"),
        (10, "kforge.tools.harness.judge._memory_capacity"), (10, "kforge.tools.harness.judge._snapshot")]
    assert _private_uses("from kforge.backends._nvidia import nvidia_smi\n", "kforge.tools.process.runner") == [
        (1, "kforge.backends._nvidia")]
    assert _private_uses("from kforge.tools.evaluate import _helper\n", "kforge.tools.harness.judge") == []
