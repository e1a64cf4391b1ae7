"""Read a candidate's text for known evaluation cheats before it runs (no code is executed here).

Rules follow the public catalogue (KernelBench's static checker, KernelGuard; see
`shared/research/kernel-eval-cheats.md`). A *hard* finding is something a kernel never needs and a
cheat does (reaching into the harness's memory, patching timers, background threads, L2
persistence); it fails the verdict. A *warning* is common in honest code too (streams, try/except,
precision casts, environment writes) and is reported with its line so the runtime checks can be
read against it. Python is parsed with `ast`; C++/CUDA sources embedded as string constants are
matched with patterns, line numbers mapped back to the candidate's text.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

__all__ = ["Finding", "scan_candidate"]


@dataclass(frozen=True)
class Finding:
    rule: str
    hard: bool
    line: int | None
    message: str


# Module attributes a candidate reads only to reach into the harness.
_INTROSPECTION = {
    ("gc", "get_objects"), ("gc", "get_referrers"), ("gc", "get_referents"), ("sys", "_getframe"),
    ("sys", "modules"), ("inspect", "currentframe"), ("inspect", "stack"), ("inspect", "getouterframes"),
    ("sys", "settrace"), ("sys", "setprofile"), ("sys", "argv"),
}
_SPAWN_MODULES = {"threading", "multiprocessing", "subprocess", "concurrent", "_thread", "ctypes", "signal"}
_SPAWN_CALLS = {("os", "fork"), ("os", "system"), ("os", "popen"), ("os", "spawnv"), ("os", "execv")}
# Objects whose attributes a candidate must not rebind (timers, sync, comparison, tensor methods).
# (And the modules of kernels a candidate launches itself, `kforge.backends.kernel_modules`: Triton's.)
_PROTECTED_ROOTS = frozenset({"time", "torch", "builtins", "numpy", "np", "os", "sys"})
_PRECISION_CALLS = {"half", "bfloat16", "set_float32_matmul_precision"}
_PRECISION_FLAGS = {"allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"}

_NATIVE_RULES = (  # (rule, hard, pattern, message) for native text, any device; a backend adds its own
    ("native_threads", True, r"\bstd::thread\b|\bpthread_create\b|\bstd::async\b|\bfork\s*\(",
     "native code starts threads or processes"),
    ("harness_patch", True, r"\bdlsym\b|\bmprotect\b|\bptrace\b|/proc/self",
     "native code reaches for the runtime's symbols, memory protections or timers"),
)


def scan_candidate(source: str, backend: str | None = None) -> list[Finding]:
    """Findings in `source`, hard ones first, at most one per rule and line: the rules of any device, and those of
    `backend`'s (`Backend.native_scan_rules`, `python_scan_rules`; every registered backend's for None)."""
    from kforge.backends import kernel_modules, scan_rules

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # the loader reports syntax errors with their location
    found: dict[tuple[str, int | None], Finding] = {}
    native, python = scan_rules(backend)
    native = _NATIVE_RULES + native

    def add(rule: str, hard: bool, node: ast.AST | None, message: str, line: int | None = None) -> None:
        at = line if line is not None else getattr(node, "lineno", None)
        found.setdefault((rule, at), Finding(rule, hard, at, message))

    protected = _PROTECTED_ROOTS | set(kernel_modules())
    for node in ast.walk(tree):
        _python_rules(node, add, protected)
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            for rule, hard, pattern, message in python:
                if re.search(pattern, dotted):
                    add(rule, hard, node, f"uses {dotted}: {message}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value:
            _native_rules(node, add, native)
    return sorted(found.values(), key=lambda f: (not f.hard, f.line or 0))


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _python_rules(node: ast.AST, add, protected: frozenset[str] | set[str]) -> None:  # noqa: ANN001 - local callback
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for name in names:
            if name.split(".")[0] in _SPAWN_MODULES:
                add("threads_or_processes", True, node, f"imports {name}: kernels need no threads, processes, "
                    "signals or raw memory access, and background work escapes the timer")
            if name.split(".")[0] == "inspect":
                add("introspection", True, node, "imports inspect: reading the harness's frames is not allowed")
    elif isinstance(node, ast.Attribute):
        dotted = _dotted(node)
        if any(dotted.endswith(f"{m}.{a}") for m, a in _INTROSPECTION):
            add("introspection", True, node, f"uses {dotted}: reaches into the harness's memory, frames or arguments")
        if tuple(dotted.split(".")[-2:]) in _SPAWN_CALLS:
            add("threads_or_processes", True, node, f"uses {dotted}: starts another process")
        if node.attr == "_make_subclass":
            add("lazy_tensor", True, node, "creates a tensor subclass: outputs must be plain torch.Tensors")
        if node.attr in _PRECISION_CALLS:
            add("precision", False, node, f"casts with .{node.attr}(): reduced precision inside the kernel")
    elif isinstance(node, ast.Assign) or isinstance(node, ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            dotted = _dotted(t) if isinstance(t, ast.Attribute) else ""
            root = dotted.split(".")[0]
            if isinstance(t, ast.Attribute) and t.attr in _PRECISION_FLAGS:
                add("precision_flag", False, node, f"sets {dotted}: changes global numerics (fails under strict "
                    "precision if it changes the result)")
            elif root in protected and dotted.count(".") >= 1:
                add("harness_patch", True, node, f"rebinds {dotted}: the harness's timers, synchronization and "
                    "library functions must stay as they are")
            if isinstance(t, ast.Subscript) and _dotted(t.value) in {"os.environ"}:
                add("environment", False, node, "writes os.environ: fine for build flags, not for changing the harness")
    elif isinstance(node, ast.ClassDef):
        for base in node.bases:
            if _dotted(base) in {"torch.Tensor", "Tensor"}:
                add("lazy_tensor", True, node, f"class {node.name} subclasses torch.Tensor: outputs must be plain tensors")
            if _dotted(base) == "Model":
                add("inherits_reference", False, node, f"class {node.name} inherits the reference Model")
    elif isinstance(node, ast.Try) and node.handlers:
        add("fallback", False, node, "try/except: a custom kernel that fails must not silently fall back to the framework")
    elif isinstance(node, ast.Call) and _dotted(node.func) in {"setattr", "builtins.setattr"} and node.args:
        target = _dotted(node.args[0])
        if target.split(".")[0] in protected:
            add("harness_patch", True, node, f"setattr on {target}: the harness's functions must stay as they are")
    elif isinstance(node, ast.Call) and _dotted(node.func) in {"open", "io.open"} and node.args:
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("/proc"):
            add("introspection", True, node, f"opens {arg.value}: reading process memory or descriptors is not allowed")


def _native_rules(node: ast.Constant, add, rules: tuple[tuple[str, bool, str, str], ...]) -> None:  # noqa: ANN001
    text: str = node.value
    for rule, hard, pattern, message in rules:
        for m in re.finditer(pattern, text):
            line = node.lineno + text.count("\n", 0, m.start())
            add(rule, hard, None, f"{message} ({m.group(0)})", line=line)
            break
