"""The pointer parameters of a CUDA kernel, and the read-only inputs it loads without the read-only cache path.

nvcc loads global data through the read-only (non-coherent, `ld.global.nc`) path only where it can prove
the data does not change during the kernel: a `const T* __restrict__` parameter, or an explicit `__ldg`.
A plain `float*` or `const float*` may alias the output, so the compiler also reloads it after stores
through other pointers. The scan is lexical and conservative: a pointer whose address is taken, that is
passed to another function, cast to a writable type or copied into a writable pointer is left
unclassified (no advice), since a write may hide there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["PointerParam", "UncachedInput", "blank_comments", "pointer_params", "uncached_inputs"]

_WRITE_AFTER = re.compile(r"\s*(?:\.\w+\s*)?(?:(?:[-+*/%&|^]|<<|>>)?=(?!=)|\+\+|--)")
_INC_BEFORE = re.compile(r"(?:\+\+|--)\s*$")
_LDG_BEFORE = re.compile(r"\b__ldg\s*\(\s*&?\s*$")
_ATOMIC_BEFORE = re.compile(r"\batomic\w*\s*\(\s*&?\s*$")
_ADDRESS_BEFORE = re.compile(r"(?<!&)&\s*$")
_DEREF_BEFORE = re.compile(r"(?:^|[=(,;{}?:!+\-<>|&]|return)\s*\*\s*(?P<paren>\(\s*)?$")
_CONST_CAST_BEFORE = re.compile(r"(?:reinterpret_cast\s*<\s*const\b[^<>]*>\s*\(|\(\s*const\s+[\w:]+\s*\*\s*\))\s*$")
# `const float* row = x + ...` (possibly through a const cast): a local alias whose reads are the parameter's.
_ALIAS_BEFORE = re.compile(r"(?P<type>(?:const\s+)?[\w:]+(?:\s+const)?)\s*\*\s*"
                           r"(?P<quals>(?:(?:const|__restrict__|__restrict)\s+)*)(?P<alias>[A-Za-z_]\w*)\s*=\s*$")
_MOVE_AFTER = re.compile(r"\s*(?:\+=|-=|\+\+|--|=(?!=))")


@dataclass(frozen=True)
class PointerParam:
    """A pointer parameter of a kernel: its declaration as written and the line it is on."""

    name: str
    line: int
    decl: str
    const: bool  # the pointee is const ('const float*', 'float const*'), not the pointer ('float* const')
    restrict: bool

    @property
    def marked(self) -> bool:
        """`const T* __restrict__`: the compiler may use the read-only path for it."""
        return self.const and self.restrict

    @property
    def suggested(self) -> str:
        """The declaration that lets the loads take the read-only path: 'const float* __restrict__ x'."""
        base = re.sub(r"\b(?:const|__restrict__|__restrict|volatile)\b|\*", " ", self.decl.rsplit(self.name, 1)[0])
        return f"const {' '.join(base.split())}* __restrict__ {self.name}"


@dataclass(frozen=True)
class UncachedInput:
    """A pointer parameter the kernel only reads, repeatedly, without `const __restrict__` or `__ldg`."""

    kernel: str
    param: PointerParam
    reads: tuple[int, ...]  # lines of its loads, through the parameter or a const alias of it
    loop_line: int | None  # the header line of a loop that holds one of the reads
    count: int  # its loads in the source (x[i] + x[i + 1] is two on one line)


def blank_comments(text: str) -> str:
    """`text` with // and /* */ comments replaced by spaces (newlines kept, so offsets and lines still match)."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def _split_top(text: str) -> list[tuple[int, str]]:
    """(offset, item) of the comma-separated items of a parameter list, not splitting inside <> or ()."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append((start, text[start:i]))
            start = i + 1
    return items + [(start, text[start:])]


def pointer_params(params: str, first_line: int) -> list[PointerParam]:
    """The single-pointer parameters of a parameter list whose '(' is on `first_line`."""
    out = []
    for offset, item in _split_top(params):
        decl = " ".join(item.split("=", 1)[0].split())
        name = re.search(r"([A-Za-z_]\w*)\s*$", decl)
        if decl.count("*") != 1 or name is None:
            continue
        before, after = decl.split("*", 1)
        line = first_line + params.count("\n", 0, offset + len(item) - len(item.lstrip()))
        out.append(PointerParam(name=name.group(1), line=line, decl=decl, const=bool(re.search(r"\bconst\b", before)),
                                restrict=bool(re.search(r"\b__restrict(?:__)?\b", after))))
    return out


def _matching_bracket(text: str, pos: int, open_ch: str, close_ch: str) -> int:
    depth = 0
    for i in range(pos, len(text)):
        depth += 1 if text[i] == open_ch else -1 if text[i] == close_ch else 0
        if depth == 0:
            return i
    return len(text) - 1


def _use(body: str, start: int, end: int) -> tuple[str, str | None]:
    """How the name at body[start:end] is used, and the alias it is copied to.

    The use is 'read', 'write', 'ldg', 'move' (the pointer itself moves), 'alias' (a const local copy),
    'marked' (a `__restrict__` local copy) or 'unknown'.
    """
    before, after = body[max(0, start - 120):start], body[end:]
    if m := re.match(r"\s*\[", after):
        rest = body[_matching_bracket(body, end + m.end() - 1, "[", "]") + 1:]
        if _LDG_BEFORE.search(before):
            return "ldg", None
        if _ATOMIC_BEFORE.search(before):
            return "write", None
        if _ADDRESS_BEFORE.search(before):
            return "unknown", None  # &p[i] handed on: a write through it is not visible here
        return ("write" if _WRITE_AFTER.match(rest) or _INC_BEFORE.search(before) else "read"), None
    if _LDG_BEFORE.search(before):
        return "ldg", None
    if _ATOMIC_BEFORE.search(before):
        return "write", None
    if d := _DEREF_BEFORE.search(before):
        rest = after
        if d.group("paren"):
            rest = body[_matching_bracket(body, start - (len(before) - before.rindex("(")), "(", ")") + 1:]
        return ("write" if _WRITE_AFTER.match(rest) or _INC_BEFORE.search(before[:d.start()]) else "read"), None
    cast = _CONST_CAST_BEFORE.search(before)
    head = before[:cast.start()] if cast else before
    if alias := _ALIAS_BEFORE.search(head):
        quals = alias.group("quals")
        if "__restrict" in quals:
            return "marked", None
        return ("alias", alias.group("alias")) if "const" in alias.group("type") else ("unknown", None)
    if cast:
        return "read", None
    if _MOVE_AFTER.match(after) or _INC_BEFORE.search(before):
        return "move", None  # the pointer itself moves (p += stride): no access
    return "unknown", None


def _uses(body: str, name: str, since: int = 0) -> list[tuple[str, int]]:
    """(use, offset) of every use of `name` in `body` from `since`, following const aliases."""
    out: list[tuple[str, int]] = []
    for m in re.finditer(rf"(?<![\w.>]){re.escape(name)}\b", body[since:]):
        start = since + m.start()
        use, alias = _use(body, start, since + m.end())
        if use == "alias" and alias:
            out += _uses(body, alias, since + m.end())
        else:
            out.append((use, start))
    return out


def uncached_inputs(kernel: str, body: str, body_line: int, params: list[PointerParam],
                    loops: list[tuple[int, int, int]]) -> list[UncachedInput]:
    """Parameters that are only read, through no `const __restrict__` nor `__ldg`, in a loop or more than once.

    Args:
        kernel: The kernel's name.
        body: The kernel's body, from its '{', comments blanked.
        body_line: The candidate line of the body's first character.
        params: The kernel's pointer parameters.
        loops: (header line, first body line, last body line) of the loops inside the kernel.
    """
    out = []
    for p in params:
        if p.marked:
            continue
        uses = _uses(body, p.name)
        kinds = {u for u, _ in uses}
        if not uses or kinds - {"read", "move"} or "read" not in kinds:
            continue  # written, loaded with __ldg, aliased by a restrict pointer, or not classified
        lines = [body_line + body.count("\n", 0, at) for u, at in uses if u == "read"]
        reads = tuple(dict.fromkeys(lines))
        loop = next((head for n in reads for head, first, last in loops if first <= n <= last), None)
        if loop is not None or len(lines) > 1:
            out.append(UncachedInput(kernel=kernel, param=p, reads=reads, loop_line=loop, count=len(lines)))
    return out
