"""Turn compiler output into `Diagnostic`s located in the candidate's own text.

Candidates embed their C++/CUDA source as Python strings; `load_inline` joins those strings into
`main.cpp` / `cuda.cu` in the build directory. A compiler message points at a line of that file;
`SourceMap` finds where each embedded string starts in the generated file and in the candidate,
and shifts the line number accordingly.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .models import Diagnostic, KernelResources

__all__ = ["SourceMap", "parse_compiler_output", "parse_ptxas_resources"]

# gcc/clang: "path:12:5: error: message"
_GCC = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?P<sev>fatal error|error|warning|note):\s*(?P<msg>.*)$")
# nvcc front end: "path(12): error: message" (optionally "error #20: ...")
_NVCC = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\):\s*(?P<sev>error|warning|remark)(?:\s*#[\w-]+(?:-D)?)?:\s*(?P<msg>.*)$")
# linker: "... undefined reference to `foo'" and "ld: ..." lines
_LINK = re.compile(r"(undefined reference to|undefined symbol|multiple definition of|ld returned \d+ exit status)")
_MAX_DIAGNOSTICS = 50


def _demangle(text: str) -> str:
    """Demangle C++ symbols (`_Z...`) in a message when c++filt is present."""
    if "_Z" not in text or shutil.which("c++filt") is None:
        return text
    try:
        out = subprocess.run(["c++filt"], input=text, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or text
    except (OSError, subprocess.TimeoutExpired):
        return text


@dataclass
class SourceMap:
    """Maps lines of generated build files back to lines of the candidate text."""

    candidate_text: str
    # generated file name -> list of (first line in file, first line in candidate, number of lines)
    spans: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)

    def add_generated_file(self, path: Path, embedded_sources: list[str], as_written: list[str] | None = None) -> None:
        """Record where each embedded source string sits in `path` and in the candidate.

        `as_written`: the same sources as the candidate wrote them, where the build used an edited
        copy of equal line count (the lean CUDA header).
        """
        try:
            generated = path.read_text(errors="replace")
        except OSError:
            return
        self.add_source(path.name, generated, embedded_sources, as_written)

    def add_source(self, name: str, generated: str, embedded_sources: list[str], as_written: list[str] | None = None) -> None:
        """Like `add_generated_file`, for a file the compiler named `name` that never hit the disk (NVRTC)."""
        spans = self.spans.setdefault(name, [])
        for src, written in zip(embedded_sources, as_written or embedded_sources):
            if not src.strip():
                continue
            at_file = generated.find(src)
            at_cand = self.candidate_text.find(written)
            if at_file < 0 or at_cand < 0:
                continue  # built dynamically; _guess_by_text handles those lines
            spans.append((generated.count("\n", 0, at_file) + 1,
                          self.candidate_text.count("\n", 0, at_cand) + 1,
                          src.count("\n") + 1))

    def candidate_line(self, file_name: str, line: int, generated_line_text: str | None = None) -> int | None:
        for file_first, cand_first, n in self.spans.get(Path(file_name).name, []):
            if file_first <= line < file_first + n:
                return cand_first + (line - file_first)
        return self._guess_by_text(generated_line_text)

    def _guess_by_text(self, text: str | None) -> int | None:
        """Fallback: the one candidate line whose text equals the generated line."""
        if not text or not text.strip():
            return None
        hits = [i for i, l in enumerate(self.candidate_text.splitlines(), 1) if l.strip() == text.strip()]
        return hits[0] if len(hits) == 1 else None

    def code_line(self, line: int | None) -> str | None:
        if line is None:
            return None
        lines = self.candidate_text.splitlines()
        return lines[line - 1].rstrip() if 0 < line <= len(lines) else None


def _read_line(build_dir: Path | None, file_name: str, line: int) -> str | None:
    if build_dir is None:
        return None
    path = build_dir / Path(file_name).name
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    return lines[line - 1] if 0 < line <= len(lines) else None


def parse_compiler_output(text: str, source_map: SourceMap, *, build_dir: Path | None, source: str) -> list[Diagnostic]:
    """Extract errors and warnings (errors first), each located in the candidate where possible.

    Messages about files outside the build directory (torch's own headers) keep their origin and
    get no candidate line.
    """
    found: list[Diagnostic] = []
    seen: set[tuple] = set()
    for raw in text.splitlines():
        line = raw.strip()
        m = _GCC.match(line) or _NVCC.match(line)
        if m:
            sev = m.group("sev")
            severity = "error" if "error" in sev else ("warning" if sev == "warning" else "note")
            file_name, file_line = m.group("file"), int(m.group("line"))
            col = m.groupdict().get("col")
            in_build = Path(file_name).name in ("main.cpp", "cuda.cu", *source_map.spans) or (
                build_dir is not None and file_name.startswith(str(build_dir)))
            cand_line = (source_map.candidate_line(file_name, file_line, _read_line(build_dir, file_name, file_line))
                         if in_build else None)
            kind = "cuda" if file_name.endswith((".cu", ".cuh")) else source
            diag = Diagnostic(severity=severity, message=m.group("msg").strip(), line=cand_line,
                              column=int(col) if col else None, source=kind,
                              origin=f"{Path(file_name).name}:{file_line}" + (f":{col}" if col else ""),
                              code_line=source_map.code_line(cand_line))
        elif _LINK.search(line):
            diag = Diagnostic(severity="error", message=_demangle(line), source="linker")
        else:
            continue
        key = (diag.severity, diag.message, diag.origin)
        if key in seen or diag.severity == "note":
            continue
        seen.add(key)
        found.append(diag)
        if len(found) >= _MAX_DIAGNOSTICS:
            break
    found.sort(key=lambda d: d.severity != "error")
    return found


_PTXAS_ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PTXAS_PROPS = re.compile(r"ptxas info\s*: Function properties for (?P<name>\S+)")
_PTXAS_FRAME = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"ptxas info\s*: Used (?P<regs>\d+) registers(?P<rest>.*)")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_resources(text: str) -> list[KernelResources]:
    """Per-kernel registers, shared memory, spills and stack from `nvcc -Xptxas -v` output."""
    kernels: dict[str, dict] = {}
    entry = props_for = None
    for line in text.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            entry = m.group("name")
            kernels.setdefault(entry, {"arch": m.group("arch")})
        elif m := _PTXAS_PROPS.search(line):
            props_for = m.group("name")
        elif (m := _PTXAS_FRAME.search(line)) and props_for:
            kernels.setdefault(props_for, {}).update(stack_bytes=int(m.group("stack")),
                                                     spill_store_bytes=int(m.group("st")),
                                                     spill_load_bytes=int(m.group("ld")))
        elif (m := _PTXAS_USED.search(line)) and entry:
            smem = _SMEM.search(m.group("rest"))
            kernels[entry].update(registers=int(m.group("regs")), shared_bytes=int(smem.group(1)) if smem else 0)
    names = _demangle("\n".join(kernels)).splitlines() if kernels else []
    if len(names) != len(kernels):
        names = list(kernels)
    return [KernelResources(kernel=pretty, **info) for pretty, info in zip(names, kernels.values())
            if "registers" in info]
