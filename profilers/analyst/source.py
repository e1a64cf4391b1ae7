"""Read the candidate's source: its loops, their pragmas, index patterns, math calls and GPU kernels.

Line numbers are the candidate's own (the C++/CUDA text sits in Python strings, so scanning the whole
file keeps them). The scan is lexical, not a compiler: it recognises the shapes of code that kernel
engineers look for first, and says nothing where it is unsure (an unparsed loop is simply not listed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ._cuda_params import PointerParam, UncachedInput, blank_comments, pointer_params, uncached_inputs
from ._stride import int_constants, scaled
from ._triton_access import StridedLoad, strided_loads

__all__ = ["GpuKernel", "Loop", "SourceFacts", "read_source"]

# Math functions that cost tens of cycles as scalar libm calls (std:: or C spellings).
_MATH_CALL = re.compile(r"(?<![\w.])(?:std::)?(exp|expf|exp2f?|expm1f?|log|logf|log2f?|log1pf?|pow|powf|tanh|tanhf|"
                        r"erf|erff|sin|sinf|cos|cosf)\s*\(")
_FOR = re.compile(r"\bfor\s*\(")
_LOOP_VAR = re.compile(r"^\s*(?:[\w:<>]+\s+)*?(?P<var>[A-Za-z_]\w*)\s*=")
_STEP = re.compile(r";\s*(?P<var>[A-Za-z_]\w*)\s*(?:\+=\s*(?P<by>[^)]+?)|\+\+|--|-=\s*[^)]+?)\s*$|;\s*(?:\+\+|--)\s*(?P<pre>[A-Za-z_]\w*)\s*$")
_PRAGMA = re.compile(r"^\s*#\s*pragma\s+omp\b(?P<rest>.*)$")
_SUBSCRIPT = re.compile(r"(?P<name>[A-Za-z_]\w*)\s*\[(?P<index>[^\[\]]+)\]")
_ATOMIC = re.compile(r"#\s*pragma\s+omp\s+(atomic|critical)|\batomic(Add|Sub|Max|Min|Exch|CAS|_add)\b|std::atomic|"
                     r"\btl\.atomic_\w+")
# `__launch_bounds__(...)` may come before or after the return type; the name is the word before the '('.
_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
_GLOBAL = re.compile(rf"__global__\s+{_BOUNDS}\w[\w\s:<>*]*?\s{_BOUNDS}\b(?P<name>(?!__launch_bounds__)[A-Za-z_]\w*)\s*\(")
_ASSIGN = re.compile(r"(?:^|[;{(]\s*|\b(?:const\s+)?(?:int|unsigned|int64_t|long|size_t|auto|int32_t)\s+)"
                     r"(?P<name>[A-Za-z_]\w*)\s*=\s*(?P<expr>[^;=][^;]*);")
_LOCAL_ARRAY = re.compile(r"^\s*(?:float|double|int|half|__half|float4|float2)\s+(?P<name>\w+)\s*\[(?P<size>[^\]]+)\]\s*;")
_PARALLEL_CALLS = re.compile(r"\bat::parallel_for\b|\bstd::thread\b|\btbb::parallel_for\b|^\s*#\s*pragma\s+omp\s+(parallel|for|taskloop)\b")


@dataclass(frozen=True)
class Loop:
    """One C-style `for` loop: its header line, body lines, nesting and what the code already does for it."""

    line: int
    var: str | None
    first: int  # first line of its body
    last: int  # last line of its body
    parent: int | None  # index (in SourceFacts.loops) of the enclosing loop
    pragmas: tuple[str, ...]  # '#pragma omp ...' lines directly above, normalized ('omp parallel for')
    step: str | None  # 'i += 64', 'i += TILE'; None for a unit step
    header: str

    @property
    def parallel(self) -> bool:
        return any("parallel" in p or p.startswith("omp for") or "taskloop" in p for p in self.pragmas)

    @property
    def simd(self) -> bool:
        return any("simd" in p for p in self.pragmas)

    def holds(self, line: int) -> bool:
        return self.line <= line <= self.last


@dataclass(frozen=True)
class GpuKernel:
    """A CUDA `__global__` function: where it is, its body, and its thread-indexed variables."""

    name: str
    line: int
    last: int
    fast_vars: tuple[str, ...]  # vary by one between neighbouring threads (threadIdx.x-derived)
    params: tuple[PointerParam, ...] = ()  # its pointer parameters
    body: tuple[int, int] = (0, 0)  # offsets of its body's braces in the scanned text


@dataclass
class SourceFacts:
    """What the scan found; every list is ordered by line."""

    lines: list[str]
    loops: list[Loop] = field(default_factory=list)
    parallel_lines: list[int] = field(default_factory=list)  # omp parallel / at::parallel_for / std::thread
    math_calls: list[tuple[int, str]] = field(default_factory=list)  # (line, function) inside loops
    atomics: list[int] = field(default_factory=list)  # lines of atomics inside loops
    gpu_kernels: list[GpuKernel] = field(default_factory=list)
    local_arrays: list[tuple[int, str, str]] = field(default_factory=list)  # (line, name, size) in GPU kernels
    triton_kernels: list[tuple[int, str]] = field(default_factory=list)
    constants: dict[str, int] = field(default_factory=dict)  # compile-time integers of the C/CUDA text
    uncached_inputs: list[UncachedInput] = field(default_factory=list)  # read-only inputs off the read-only path
    read_only_marked: tuple[int, str] | None = None  # (line, how): a `const T* __restrict__` parameter or `__ldg`
    triton_strided_loads: list[StridedLoad] = field(default_factory=list)

    @property
    def has_cpp_loops(self) -> bool:
        return bool(self.loops)

    def children(self, index: int) -> list[int]:
        return [i for i, loop in enumerate(self.loops) if loop.parent == index]

    def innermost(self) -> list[int]:
        return [i for i in range(len(self.loops)) if not self.children(i)]

    def chain(self, index: int) -> list[int]:
        """The loop and its enclosing loops, outermost first."""
        out = []
        cur: int | None = index
        while cur is not None:
            out.append(cur)
            cur = self.loops[cur].parent
        return out[::-1]

    def strided_subscripts(self, index: int) -> list[tuple[int, str]]:
        """(line, 'b[k * n + j]') in the loop's own body where its variable is multiplied: a strided walk."""
        loop = self.loops[index]
        if loop.var is None:
            return []
        by_stride = scaled(loop.var)
        found = []
        for n in range(loop.line, loop.last + 1):
            code = _code(self.lines[n - 1])
            if n == loop.line:
                code = code[code.find(")") + 1:] if ")" in code else ""
            for m in _SUBSCRIPT.finditer(code):
                if by_stride.search(m.group("index")):
                    found.append((n, m.group(0)))
        return found

    def unit_subscripts(self, index: int) -> list[tuple[int, str]]:
        loop = self.loops[index]
        if loop.var is None:
            return []
        var = re.compile(rf"(?<![\w.]){re.escape(loop.var)}\b")
        out = []
        for n in range(loop.first, loop.last + 1):
            for m in _SUBSCRIPT.finditer(_code(self.lines[n - 1])):
                if var.search(m.group("index")) and (n, m.group(0)) not in self.strided_subscripts(index):
                    out.append((n, m.group(0)))
        return out


def _code(line: str) -> str:
    """The line without a // comment."""
    return line.split("//", 1)[0]


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _matching(text: str, pos: int, open_ch: str, close_ch: str) -> int:
    """Index of the bracket closing the one at `pos` (or len(text) when unbalanced)."""
    depth = 0
    for i in range(pos, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i
    return len(text)


def _statement_end(text: str, pos: int) -> int:
    """End of the statement starting at `pos`: a braced block, a nested for, or up to ';'."""
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    if text.startswith("{", pos):
        return _matching(text, pos, "{", "}")
    if m := _FOR.match(text, pos):
        close = _matching(text, m.end() - 1, "(", ")")
        return _statement_end(text, close + 1)
    end = text.find(";", pos)
    return len(text) if end < 0 else end


def _pragmas_above(lines: list[str], line: int) -> tuple[str, ...]:
    found = []
    n = line - 1
    while n >= 1:
        stripped = lines[n - 1].strip()
        if not stripped:
            n -= 1
            continue
        m = _PRAGMA.match(stripped)
        if m is None:
            break
        found.append("omp " + " ".join(m.group("rest").split()))
        n -= 1
    return tuple(found)


def _loops(text: str, lines: list[str]) -> list[Loop]:
    spans: list[tuple[int, int, Loop]] = []
    for m in _FOR.finditer(text):
        line = _line_of(text, m.start())
        if _code(lines[line - 1]).find("for") < 0:
            continue  # in a comment
        close = _matching(text, m.end() - 1, "(", ")")
        header = text[m.end():close]
        parts = header.split(";")
        if len(parts) != 3:
            continue  # range-for or not C
        var = _LOOP_VAR.match(parts[0])
        step = _STEP.search(";" + parts[2].strip()) if parts[2].strip() else None
        step_text = None
        if step and step.group("by") and step.group("by").strip() != "1":
            step_text = f"{step.group('var')} += {step.group('by').strip()}"
        end = _statement_end(text, close + 1)
        body_first = _line_of(text, close + 1)
        spans.append((m.start(), end, Loop(line=line, var=var.group("var") if var else None, first=body_first,
                                           last=_line_of(text, end), parent=None, pragmas=_pragmas_above(lines, line),
                                           step=step_text, header=" ".join(text[m.start():close + 1].split()))))
    loops = []
    for i, (start, end, loop) in enumerate(spans):
        parents = [j for j, (s, e, _) in enumerate(spans[:i]) if s < start and end <= e]
        loops.append(Loop(**{**loop.__dict__, "parent": parents[-1] if parents else None}))
    return loops


def _gpu_kernels(text: str, lines: list[str]) -> tuple[list[GpuKernel], list[tuple[int, str, str]]]:
    kernels, arrays = [], []
    for m in _GLOBAL.finditer(text):
        close = _matching(text, m.end() - 1, "(", ")")
        brace = re.compile(r"\s*").match(text, close + 1).end()
        if not text.startswith("{", brace):
            continue  # a declaration (`...);`): its definition comes later
        end = _matching(text, brace, "{", "}")
        body = text[brace:end]
        fast: list[str] = []
        for a in _ASSIGN.finditer(body):
            expr = a.group("expr")
            thread_x = "threadIdx.x" in expr or any(re.search(rf"(?<![\w.]){re.escape(v)}\b", expr) for v in fast)
            # i / N changes once every N threads: the row of a thread, not its fast index.
            if thread_x and not re.search(r"/", expr) and a.group("name") not in fast:
                fast.append(a.group("name"))
        first, last = _line_of(text, m.start()), _line_of(text, end)
        params = pointer_params(text[m.end():close], _line_of(text, m.end() - 1))
        kernels.append(GpuKernel(name=m.group("name"), line=first, last=last, fast_vars=tuple(fast), params=tuple(params),
                                 body=(brace, end)))
        for n in range(first, last + 1):
            if am := _LOCAL_ARRAY.match(_code(lines[n - 1])):
                arrays.append((n, am.group("name"), am.group("size").strip()))
    return kernels, arrays


_TRITON_DEF = re.compile(r"^\s*def\s+(?P<name>\w+)\s*\(")


def _triton_kernels(lines: list[str]) -> list[tuple[int, str]]:
    out = []
    for n, line in enumerate(lines, start=1):
        if line.strip().startswith("@triton.jit") or line.strip().startswith("@triton.autotune"):
            for k in range(n, min(n + 6, len(lines))):
                if m := _TRITON_DEF.match(lines[k]):
                    out.append((k + 1, m.group("name")))
                    break
    return list(dict.fromkeys(out))


def read_source(code: str) -> SourceFacts:
    """Scan the candidate's text (Python with embedded C++/CUDA, or Triton)."""
    lines = code.splitlines()
    facts = SourceFacts(lines=lines)
    facts.loops = _loops(code, lines)
    facts.parallel_lines = [n for n, line in enumerate(lines, 1) if _PARALLEL_CALLS.search(_code(line))]
    in_loop = lambda n: any(loop.first <= n <= loop.last for loop in facts.loops)  # noqa: E731
    for n, line in enumerate(lines, 1):
        code_part = _code(line)
        if in_loop(n):
            facts.math_calls += [(n, m.group(1)) for m in _MATH_CALL.finditer(code_part)]
            if _ATOMIC.search(code_part):
                facts.atomics.append(n)
    facts.gpu_kernels, facts.local_arrays = _gpu_kernels(code, lines)
    for k in facts.gpu_kernels:  # a GPU kernel's body runs once per thread: it is the hot loop
        facts.atomics += [n for n in range(k.line, k.last + 1) if n not in facts.atomics and _ATOMIC.search(_code(lines[n - 1]))]
    facts.atomics.sort()
    facts.triton_kernels = _triton_kernels(lines)
    facts.constants = int_constants(code)
    _read_only_inputs(code, facts)
    facts.triton_strided_loads = strided_loads(code) if facts.triton_kernels else []
    return facts


def _read_only_inputs(text: str, facts: SourceFacts) -> None:
    """Fill `uncached_inputs` and `read_only_marked` from the CUDA kernels' parameters and bodies."""
    for k in facts.gpu_kernels:
        brace, end = k.body
        body = blank_comments(text[brace:end + 1])
        if facts.read_only_marked is None and (marked := next((p for p in k.params if p.marked), None)):
            facts.read_only_marked = (marked.line, marked.decl)
        if facts.read_only_marked is None and (ldg := body.find("__ldg(")) >= 0:
            facts.read_only_marked = (_line_of(text, brace + ldg), "__ldg(...)")
        loops = [(loop.line, loop.first, loop.last) for loop in facts.loops if k.line <= loop.line <= k.last]
        facts.uncached_inputs += uncached_inputs(k.name, body, _line_of(text, brace), list(k.params), loops)
