"""What multiplies an index, and whether that factor is decidably more than 1: the shared test of the stride rules.

A loop walks memory with unit stride, and a GPU load is coalesced, when the index that varies fastest
(the loop variable; a threadIdx.x-derived variable in CUDA; the fastest `tl.arange` axis in Triton) moves
by one element. The CUDA and Triton coalescing rules both ask the same two questions: what multiplies
that variable, and is the factor more than 1? A size ('cols', 'N', a literal 4, a `constexpr int K = 48`)
is. A bare stride argument ('stride', 'stride_xk') is not decided by the source: it is 1 for the
contiguous axis of a tensor (and Triton specializes an integer argument equal to 1), so it gives no advice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

__all__ = ["StrideKind", "factors", "int_constants", "scaled", "stride_kind"]

StrideKind = Literal["unit", "strided", "unknown"]

# Names that hold a size or a row stride, never 1 in a problem worth a kernel (matched on the last
# identifier, case-insensitive): 'cols', 'n_cols', 'N', 'K', 'hidden_size', 'BLOCK_K', 'row_stride'.
_SIZE_NAME = re.compile(r"(?:n_?|num_?)?(?:cols?|columns|rows?|[mnkdchwl]|dim|width|height|hidden|(?:in_|out_)?features?|"
                        r"channels?|size|len|length|ld[a-z]?|(?:block|tile)(?:_?size)?(?:_?[a-z])?)|\w+_(?:size|dim|len)|"
                        r"\w*row_?stride\w*|\w*stride_?row\w*", re.I)
_CAST = (r"(?:\(\s*(?:const\s+)?(?:unsigned\s+)?(?:long\s+long|long|int|size_t|int64_t|int32_t|unsigned|uint32_t|uint64_t)"
         r"\s*\)\s*)?")
_FACTOR = r"[A-Za-z_][\w.]*(?:->\w+)?|\d+|\([^()]*\)"
_CONSTANT = re.compile(r"\b(?:constexpr|const)\s+(?:static\s+)?(?:int|long|unsigned|size_t|int64_t|int32_t|auto)\s+"
                       r"(?P<name>[A-Za-z_]\w*)\s*=\s*(?P<value>\d+)\s*;|^\s*#\s*define\s+(?P<macro>[A-Za-z_]\w*)\s+\(?"
                       r"(?P<mvalue>\d+)\)?\s*$", re.M)


def scaled(var: str) -> re.Pattern[str]:
    """`var * x` or `x * var` in an index expression: `var` moves the index by more than one element."""
    v = re.escape(var)
    return re.compile(rf"(?<![\w.])({v}\s*\*\s*[\w(]|[\w)]\s*\*\s*{v}\b)")


def factors(var: str, index: str) -> list[str]:
    """The factors multiplying `var` in a C index: 'row * cols + j' -> ['cols']; '(long)c * n' -> ['n']."""
    v = re.escape(var)
    right = re.finditer(rf"(?<![\w.>]){v}\s*\*\s*{_CAST}(?P<f>{_FACTOR})", index)
    left = re.finditer(rf"(?P<f>{_FACTOR})\s*\*\s*{_CAST}{v}\b(?!\s*[\[(])", index)
    return [m.group("f") for m in right] + [m.group("f") for m in left]


def int_constants(text: str) -> dict[str, int]:
    """Compile-time integer constants of C/CUDA text: `constexpr int K = 48;`, `const int TILE = 16;`, `#define B 4`."""
    out = {}
    for m in _CONSTANT.finditer(text):
        name = m.group("name") or m.group("macro")
        out[name] = int(m.group("value") or m.group("mvalue"))
    return out


def _unwrap(text: str) -> str:
    text = text.strip()
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1].strip()
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def _product(text: str) -> list[str]:
    """'BLOCK * stride' -> ['BLOCK', 'stride']: the top-level factors of a product (one item if it is none)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1, "[": 1, "]": -1}.get(ch, 0)
        if ch == "*" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def stride_kind(factor: str, known: Mapping[str, StrideKind | int] | None = None) -> StrideKind:
    """Whether `factor` is 1, decidably more than 1, or not decided by the source.

    Args:
        factor: The source text of the factor ('cols', '4', 'stride_xk', '(BLOCK * n)').
        known: What the caller knows of names: an integer value (a constant, a literal launch argument) or a kind.
    """
    text = re.sub(rf"^{_CAST}", "", _unwrap(factor))
    parts = _product(text)
    if len(parts) > 1:
        kinds = [stride_kind(p, known) for p in parts]
        if "strided" in kinds:
            return "strided"
        return "unit" if all(k == "unit" for k in kinds) else "unknown"
    value: StrideKind | int | None = int(text) if text.isdigit() else (known or {}).get(text)
    if isinstance(value, int):
        return "unit" if value == 1 else "strided" if value > 1 else "unknown"
    if value is not None:
        return value
    if re.fullmatch(r"(?:blockDim|gridDim)\.[xyz]", text):
        return "strided"
    last = re.split(r"\.|->", text)[-1]
    return "strided" if re.fullmatch(r"[A-Za-z_]\w*", last) and _SIZE_NAME.fullmatch(last) else "unknown"
