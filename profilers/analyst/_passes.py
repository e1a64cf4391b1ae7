"""Multi-pass loops that could be fewer passes: sibling loops over the same range, read from the source.

Three shapes, each with its own right advice:
- a *chain*: one pass writes an array that a later pass reads back at the same index, and the later pass
  needs nothing the earlier one reduced: the passes merge into one loop, the intermediate stays in a
  register, and each pass's write and re-read of the whole array disappear;
- *statistics*: a pass reduces an input (a sum), and a later pass reads the same input again to reduce it
  with that result (the variance around the mean): one pass computes both (Welford, or sum and sum of
  squares in double);
- *dependent passes*: three or more passes, each needing what the previous one reduced (softmax's max,
  sum, scale): an online algorithm keeps running values and rescales (online max-and-sum), so two passes.
Passes that a reduction separates (softmax's scale pass needs the finished sum) are not a chain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

from .source import Loop, SourceFacts

__all__ = ["PassGroup", "pass_groups"]

# `acc += ...`, `m = std::max(m, ...)`, `s = s + ...`: a scalar accumulated over the loop.
_REDUCE = re.compile(r"(?<![\w.\]])(?P<name>[A-Za-z_]\w*)\s*(?:[+\-*/]=|=\s*(?:std::)?f?(?:max|min)f?\s*\(\s*(?P=name)\b|"
                     r"=\s*(?P=name)\s*[+\-*/])")
_SUBSCRIPT = re.compile(r"(?P<name>[A-Za-z_]\w*)\s*\[(?P<index>[^\[\]]+)\]")
_WRITE_AFTER = re.compile(r"\s*(?:[+\-*/]?=)(?!=)")
_ASSIGN = re.compile(r"(?:^|[;{]|\b(?:const\s+)?(?:float|double|auto|int|int64_t)\s+)\s*(?P<name>[A-Za-z_]\w*)\s*=(?!=)"
                     r"(?P<rhs>[^;]*);")

_LOCAL_ARRAY = re.compile(r"\b(?:float|double|int|int64_t|half|__half)\s+([A-Za-z_]\w*)\s*\[[^\]]+\]\s*[;={]")


@dataclass(frozen=True)
class PassGroup:
    """Sibling loops over the same range that could be fewer passes."""

    kind: Literal["chain", "statistics", "dependent"]
    loops: tuple[int, ...]  # indices into SourceFacts.loops, in order
    arrays: tuple[str, ...]  # the intermediates (chain) or the input read twice (statistics)
    nested: bool  # inside an outer loop (per row: the data is likely in cache) or over the whole tensor


@dataclass
class _Pass:
    index: int
    writes: dict[str, set[str]]  # array -> its indices, the loop variable written '@'
    reads: dict[str, set[str]]
    reduced: set[str]  # scalars accumulated over the loop
    names: set[str]  # every identifier in the body


def _code(line: str) -> str:
    return line.split("//", 1)[0]


def _body(facts: SourceFacts, loop: Loop) -> str:
    text = "\n".join(_code(facts.lines[n - 1]) for n in range(loop.line, loop.last + 1))
    return text[text.find(")", text.find("for")) + 1:] if "for" in text else text  # without the header


def _range(loop: Loop) -> str | None:
    """'0 .. @ < cols' with the loop's own variable as '@': loops over the same range compare equal."""
    parts = loop.header[loop.header.find("(") + 1:-1].split(";")
    if len(parts) != 3 or loop.var is None or loop.step:
        return None
    start = parts[0].split("=", 1)[-1].strip()
    var = re.compile(rf"\b{re.escape(loop.var)}\b")
    return f"{start} .. {var.sub('@', ' '.join(parts[1].split()))}"


def _read_pass(facts: SourceFacts, index: int) -> _Pass:
    loop = facts.loops[index]
    body = _body(facts, loop)
    var = re.compile(rf"\b{re.escape(loop.var or '@')}\b")
    writes: dict[str, set[str]] = {}
    reads: dict[str, set[str]] = {}
    for m in _SUBSCRIPT.finditer(body):
        index_text = var.sub("@", " ".join(m.group("index").split()))
        written = _WRITE_AFTER.match(body, m.end())
        target = writes if written else reads
        target.setdefault(m.group("name"), set()).add(index_text)
        if written and body[m.end():].lstrip()[:1] in "+-*/":  # `o[i] *= s` reads o[i] too
            reads.setdefault(m.group("name"), set()).add(index_text)
    reduced = {m.group("name") for m in _REDUCE.finditer(body)} - set(writes) - {loop.var}
    return _Pass(index, writes, reads, reduced, set(re.findall(r"[A-Za-z_]\w*", body)))


def _derived(facts: SourceFacts, after: Loop, before: Loop, scalars: set[str]) -> set[str]:
    """The scalars and the names assigned from them between two loops (`inv = 1.f / sum`)."""
    names = set(scalars)
    between = "\n".join(_code(facts.lines[n - 1]) for n in range(after.last + 1, before.line))
    for m in _ASSIGN.finditer(between):
        if names & set(re.findall(r"[A-Za-z_]\w*", m.group("rhs"))):
            names.add(m.group("name"))
    return names


def _depends(facts: SourceFacts, earlier: _Pass, later: _Pass) -> bool:
    """Whether `later` uses what `earlier` reduced: it cannot start before `earlier` has finished."""
    if not earlier.reduced:
        return False
    derived = _derived(facts, facts.loops[earlier.index], facts.loops[later.index], earlier.reduced)
    return bool(derived & later.names)


def _written_between(facts: SourceFacts, after: Loop, before: Loop, array: str) -> bool:
    between = "\n".join(_code(facts.lines[n - 1]) for n in range(after.last + 1, before.line))
    return any(m.group("name") == array and _WRITE_AFTER.match(between, m.end()) for m in _SUBSCRIPT.finditer(between))


def _siblings(facts: SourceFacts) -> list[list[int]]:
    """Loops with the same parent and the same range, in source order, two or more; not in GPU kernels, where
    a thread's loops run over its registers, not over memory."""
    groups: dict[tuple[int | None, str], list[int]] = {}
    for i, loop in enumerate(facts.loops):
        if any(k.line <= loop.line <= k.last for k in facts.gpu_kernels):
            continue
        if (span := _range(loop)) is not None:
            groups.setdefault((loop.parent, span), []).append(i)
    return [g for g in groups.values() if len(g) >= 2]


def pass_groups(facts: SourceFacts) -> list[PassGroup]:
    """Every group of sibling passes that could be fewer, in source order."""
    found: list[PassGroup] = []
    local = set(_LOCAL_ARRAY.findall("\n".join(facts.lines)))
    for group in _siblings(facts):
        passes = [_read_pass(facts, i) for i in group]
        nested = facts.loops[group[0]].parent is not None
        # chains: runs of passes, each reading back (at the same index) an array an earlier one wrote
        run: list[_Pass] = [passes[0]]
        through: list[str] = []
        for later in passes[1:]:
            # a small local array (`float h[K]`) is in registers or L1 already; an array rewritten in between
            # is not the one the earlier pass left
            carried = [a for p in run for a, idx in p.writes.items() if later.reads.get(a, set()) & idx
                       and a not in local and not _written_between(facts, facts.loops[p.index], facts.loops[later.index], a)]
            if carried and not any(_depends(facts, p, later) for p in run):
                run.append(later)
                through += [a for a in carried if a not in through]
                continue
            if len(run) >= 2:
                found.append(PassGroup("chain", tuple(p.index for p in run), tuple(through), nested))
            run, through = [later], []
        if len(run) >= 2:
            found.append(PassGroup("chain", tuple(p.index for p in run), tuple(through), nested))
        chained = {i for g in found for i in g.loops}
        # statistics: a reduction of an input, then a reduction of the same input that needs the first
        for a, b in pairwise(passes):
            if a.index in chained or b.index in chained or b.writes or not b.reduced:
                continue
            inputs = [x for x in a.reads if x in b.reads and x not in a.writes]
            if inputs and _depends(facts, a, b):
                found.append(PassGroup("statistics", (a.index, b.index), tuple(inputs), nested))
        if not any(set(g.loops) & set(group) for g in found) and len(group) >= 3 and all(
                _depends(facts, p, q) for p, q in pairwise(passes)):
            found.append(PassGroup("dependent", tuple(group), (), nested))
    return sorted(found, key=lambda g: facts.loops[g.loops[0]].line)
