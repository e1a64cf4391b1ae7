"""KernelBench problems by name, read from a checkout the user configures (`KFORGE_KERNELBENCH_DIR`).

A name is ``kernelbench:level<N>/<file stem>``, e.g. ``kernelbench:level1/23_Softmax``; the problem's
number alone (``kernelbench:level1/23``) and a trailing ``.py`` are accepted too. The files are read
where they lie: KernelBench's problems are never copied into KForge.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

__all__ = ["PREFIX", "REPOSITORY", "KernelBench", "KernelBenchError", "problems_dir"]

PREFIX = "kernelbench:"
REPOSITORY = "https://github.com/ScalingIntelligence/KernelBench"
_LEVEL = re.compile(r"^level(\d+)$")
_NAME = re.compile(r"^(?:level)?(\d+)/(\d+)?([A-Za-z0-9_.-]*?)(?:\.py)?$")


class KernelBenchError(LookupError):
    """A KernelBench name that cannot be served; the message says why and what to do."""


def problems_dir(root: Path) -> Path | None:
    """The folder holding level1/, level2/, ... in a checkout (its KernelBench/ folder), or None."""
    for candidate in (root / "KernelBench", root):
        if any(_LEVEL.match(p.name) for p in candidate.glob("level*") if p.is_dir()):
            return candidate
    return None


class KernelBench:
    """The problems of one KernelBench checkout (or of none: every lookup then says how to configure one)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._dir = problems_dir(root) if root is not None else None

    @property
    def configured(self) -> bool:
        return self._dir is not None

    def _files(self) -> dict[str, Path]:
        """{'level1/23_Softmax': path} for every problem, in level then problem-number order."""
        if self._dir is None:
            return {}
        found = []
        for level in self._dir.iterdir():
            m = _LEVEL.match(level.name)
            if not (m and level.is_dir()):
                continue
            for f in level.glob("*.py"):
                number = re.match(r"\d+", f.stem)
                found.append(((int(m.group(1)), int(number.group()) if number else 0, f.stem), f"{level.name}/{f.stem}", f))
        return {name: path for _, name, path in sorted(found)}

    def names(self) -> list[str]:
        return [PREFIX + n for n in self._files()]

    def reference(self, name: str) -> str:
        """The reference source of `kernelbench:levelN/...`; KernelBenchError says why not."""
        wanted = name.removeprefix(PREFIX).strip()
        if self._dir is None:
            where = (f"KFORGE_KERNELBENCH_DIR={self.root} holds no KernelBench levels (level1/, level2/, ...)"
                     if self.root is not None else "no KernelBench checkout is configured")
            raise KernelBenchError(f"problem {name!r} is a KernelBench problem, but {where}: clone {REPOSITORY} and "
                                   "set KFORGE_KERNELBENCH_DIR (or kernelbench_dir in the config file) to it, then "
                                   "restart the server")
        files = self._files()
        m = _NAME.match(wanted)
        if m:
            level, number, rest = m.groups()
            for key, path in files.items():
                key_level, stem = key.split("/", 1)
                if key_level != f"level{int(level)}":
                    continue
                stem_number = re.match(r"\d+", stem)
                same_number = number is not None and stem_number is not None and int(stem_number.group()) == int(number)
                if (same_number and not rest) or stem.lower() == f"{number or ''}{rest}".lower():
                    return path.read_text()
        close = difflib.get_close_matches(wanted, list(files), n=3, cutoff=0.5)
        hint = f"; closest: {', '.join(PREFIX + c for c in close)}" if close else ""
        raise KernelBenchError(f"no KernelBench problem {name!r} in {self._dir} (names look like "
                               f"'{PREFIX}level1/23_Softmax' or '{PREFIX}level1/23'; resource kforge://problems lists "
                               f"all {len(files)}){hint}")
