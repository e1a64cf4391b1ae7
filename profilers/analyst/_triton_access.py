"""Triton loads whose block has no unit-stride axis: strided, uncoalesced global loads decided from the source.

Triton's coalesce pass orders each load's register layout by the pointer's known contiguity
(`getOrderFromContiguity` in TritonGPU's CoalesceUtils): an axis whose `tl.arange` is added without a
factor becomes the fastest, whichever axis it is, so `ptr + offs_m[:, None] + offs_k[None, :] * stride`
still loads coalesced. A load is uncoalesced only when every `tl.arange` axis of its offset is multiplied
by something more than 1: `ptr + offs * n_cols`, `ptr + offs * 4`. Factors are judged by `_stride.stride_kind`,
with what the launch in the same file passes (`kernel[grid](x, x.stride(0), STRIDE=4)`): a bare stride
argument that may be 1 decides nothing. The candidate's Python is read with `ast`, so lines are its own.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace

from ._stride import StrideKind, stride_kind

__all__ = ["StridedLoad", "strided_loads"]


@dataclass(frozen=True)
class StridedLoad:
    """A `tl.load` whose every `tl.arange` axis is multiplied by a factor more than 1."""

    kernel: str
    line: int
    pointer: str  # the pointer argument as written ('x_ptr + rows * n_cols'; 'ptrs = ...' for a named one)
    factor: str  # what multiplies the fastest axis's tl.arange
    rank: int  # 1 for a vector block, 2 for a matrix block


@dataclass(frozen=True)
class _Term:
    """A `tl.arange` in an offset: its axis in a block of `rank` axes, and the factors multiplying it."""

    axis: int
    rank: int
    factors: tuple[str, ...] = ()


_PASS_THROUGH = {"multiple_of", "max_contiguous", "max_constancy"}


def _tl(func: ast.expr, name: str) -> bool:
    """`tl.<name>` or `triton.language.<name>`."""
    return isinstance(func, ast.Attribute) and func.attr == name and ast.unparse(func.value) in {"tl", "triton.language"}


class _Kernel:
    """Evaluates a kernel's offsets to `tl.arange` terms; None stands for 'not decided' (gathers, %, masks)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.env: dict[str, list[_Term] | None] = {}
        self.loads: list[tuple[int, ast.expr, list[_Term] | None]] = []
        self.defined: dict[str, str] = {}  # name -> the expression it was first bound to
        self.pointers: dict[int, str] = {}  # line -> 'ptrs = x_ptr + rows * n_cols' where a load takes a name

    def visit(self, body: list[ast.stmt]) -> None:
        for s in body:
            if isinstance(s, (ast.For, ast.AsyncFor)):
                self._find_loads(s.iter)
                for name in ast.walk(s.target):
                    if isinstance(name, ast.Name):
                        self.env[name.id] = []  # a loop index over integers: a scalar
                self.visit(s.body + s.orelse)
            elif isinstance(s, (ast.While, ast.If)):
                self._find_loads(s.test)
                self.visit(s.body + s.orelse)
            elif isinstance(s, (ast.With, ast.AsyncWith)):
                self.visit(s.body)
            elif not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._find_loads(s)
                self._bind_statement(s)

    def _find_loads(self, node: ast.AST) -> None:
        for n in ast.walk(node):
            if isinstance(n, ast.Call) and _tl(n.func, "load"):
                ptr = n.args[0] if n.args else next((k.value for k in n.keywords if k.arg == "pointer"), None)
                if ptr is not None:
                    self.loads.append((n.lineno, ptr, self.eval(ptr)))
                    if isinstance(ptr, ast.Name) and ptr.id in self.defined:
                        self.pointers[n.lineno] = f"{ptr.id} = {self.defined[ptr.id]}"

    def _bind_statement(self, s: ast.stmt) -> None:
        if isinstance(s, ast.Assign):
            for target in s.targets:
                self._bind(target, s.value)
        elif isinstance(s, ast.AnnAssign) and s.value is not None:
            self._bind(s.target, s.value)
        elif isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name):
            self._bind(s.target, ast.BinOp(left=ast.Name(id=s.target.id, ctx=ast.Load()), op=s.op, right=s.value))

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = self.eval(value)
            self.defined.setdefault(target.id, ast.unparse(value))  # the first definition: `ptrs += ...` only moves it
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                self._bind(t, v)
        else:
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    self.env[n.id] = None

    def eval(self, node: ast.expr) -> list[_Term] | None:
        """The tl.arange terms of `node` ([] for a scalar), or None where the source does not decide them."""
        if isinstance(node, ast.Name):
            return self.env.get(node.id, [])
        if isinstance(node, (ast.Constant, ast.Attribute, ast.Compare, ast.BoolOp, ast.Tuple, ast.List)):
            return []
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.UnaryOp):
            inner = self.eval(node.operand)
            return inner if isinstance(node.op, ast.UAdd) or inner == [] else None
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Subscript):
            return self._expand(node)
        return self._opaque(node)

    def _opaque(self, node: ast.AST) -> list[_Term] | None:
        """A scalar where no tl.arange flows in; otherwise not decided."""
        inner = [self.eval(c) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
        return [] if all(i == [] for i in inner) else None

    def _binop(self, node: ast.BinOp) -> list[_Term] | None:
        left, right = self.eval(node.left), self.eval(node.right)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left if not right else None  # a reversed arange is not a unit stride
        if isinstance(node.op, ast.Mult) and not (left and right):
            terms, factor = (left, node.right) if left else (right, node.left)
            return [replace(t, factors=t.factors + (ast.unparse(factor),)) for t in terms]
        return [] if not left and not right else None

    def _call(self, node: ast.Call) -> list[_Term] | None:
        if _tl(node.func, "arange"):
            return [_Term(axis=0, rank=1)]
        if node.args and (any(_tl(node.func, n) for n in _PASS_THROUGH)):
            return self.eval(node.args[0])
        if isinstance(node.func, ast.Attribute) and node.func.attr == "to":
            return self.eval(node.func.value)
        if _tl(node.func, "load"):
            return []  # loaded values used as indices: a gather, whose stride the source does not show
        return self._opaque(node)

    def _expand(self, node: ast.Subscript) -> list[_Term] | None:
        """`offs[:, None]`, `offs[None, :]`: the terms' axes in the broadcast block."""
        base = self.eval(node.value)
        if not base:
            return base
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        colons = [i for i, e in enumerate(items) if isinstance(e, ast.Slice) and e.lower is None and e.upper is None
                  and e.step is None]
        if any(not (i in colons or (isinstance(e, ast.Constant) and e.value is None)) for i, e in enumerate(items)):
            return None
        if any(t.rank != len(colons) for t in base):
            return None
        return [replace(t, axis=colons[t.axis], rank=len(items)) for t in base]


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any(re.search(r"\bjit\b", ast.unparse(d)) for d in fn.decorator_list)


def _dims_seen(tree: ast.Module) -> dict[str, int]:
    """The highest dimension the file indexes of each tensor name: x.stride(1), x.shape[1], x.size(1), `m, n = x.shape`."""
    seen: dict[str, int] = {}
    for n in ast.walk(tree):
        name, dim = None, None
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in {"stride", "size"} \
                and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, int):
            name, dim = ast.unparse(n.func.value), n.args[0].value
        elif isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr == "shape" \
                and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, int):
            name, dim = ast.unparse(n.value.value), n.slice.value
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute) and n.value.attr == "shape" \
                and isinstance(n.targets[0], ast.Tuple):
            name, dim = ast.unparse(n.value.value), len(n.targets[0].elts) - 1
        if name is not None and dim is not None and dim >= 0:
            seen[name] = max(seen.get(name, 0), dim)
    return seen


def _arg_kind(arg: ast.expr, dims: dict[str, int]) -> StrideKind | int | None:
    """What a launch argument says of a factor: its literal value, or a tensor's stride or size."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, int) and not isinstance(arg.value, bool):
        return arg.value
    if isinstance(arg, ast.Name):
        return "strided" if stride_kind(arg.id) == "strided" else None  # a size by name: `cols`, `n`
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.args:
        try:
            index = ast.literal_eval(arg.args[0])
        except (ValueError, TypeError, SyntaxError):
            return None
        tensor = ast.unparse(arg.func.value)
        if arg.func.attr == "size" and isinstance(index, int):
            return "strided"
        if arg.func.attr == "stride" and isinstance(index, int):
            if index == -1:
                return "unit"  # the last axis of a contiguous tensor
            # stride(-2), or stride(i) of a tensor the file shows has an axis after i: a row stride
            return "strided" if index == -2 or (index >= 0 and dims.get(tensor, -1) > index) else "unknown"
    if isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Attribute) and arg.value.attr == "shape":
        return "strided"
    return None


def _launch_kinds(tree: ast.Module, fn: ast.FunctionDef) -> dict[str, StrideKind | int]:
    """What the launches `fn[grid](...)` in the file pass for each parameter, where all launches agree."""
    params = [a.arg for a in fn.args.args]
    dims = _dims_seen(tree)
    seen: dict[str, list[StrideKind | int | None]] = {}
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
                and ast.unparse(n.func.value).split(".")[-1] == fn.name):
            continue
        if any(isinstance(a, ast.Starred) for a in n.args) or any(k.arg is None for k in n.keywords):
            return {}
        for name, arg in [*zip(params, n.args), *((k.arg, k.value) for k in n.keywords)]:
            seen.setdefault(name, []).append(_arg_kind(arg, dims))
    return {name: kinds[0] for name, kinds in seen.items() if kinds[0] is not None and all(k == kinds[0] for k in kinds)}


def _judge(fn: ast.FunctionDef, line: int, pointer: str, terms: list[_Term] | None,
           known: dict[str, StrideKind | int]) -> StridedLoad | None:
    if not terms:
        return None
    rank = max(t.rank for t in terms)
    if any(stride_kind(" * ".join(t.factors) or "1", known) != "strided" for t in terms):
        return None  # an axis added without a factor (Triton makes it the fastest), or a factor that may be 1
    fastest = max(terms, key=lambda t: t.axis + rank - t.rank)
    return StridedLoad(kernel=fn.name, line=line, pointer=pointer, factor=" * ".join(fastest.factors), rank=rank)


def strided_loads(code: str) -> list[StridedLoad]:
    """The `tl.load`s of the file's `@triton.jit` kernels whose block has no unit-stride axis, by line."""
    if "triton" not in code:
        return []
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    out = []
    for fn in ast.walk(tree):
        if not (isinstance(fn, ast.FunctionDef) and _is_jit(fn)):
            continue
        kernel = _Kernel(fn.name)
        kernel.visit(fn.body)
        known = _launch_kinds(tree, fn)
        for line, ptr, terms in kernel.loads:
            pointer = kernel.pointers.get(line, ast.unparse(ptr))
            if (found := _judge(fn, line, pointer, terms, known)) is not None:
                out.append(found)
    return sorted(out, key=lambda s: s.line)
