"""Split a KernelBench-style `.cu` source into a torch-free CUDA part and a C++ part (runs in workers only).

In the KernelBench convention one `.cu` source holds the kernels *and* the torch wrappers that launch
them, so nvcc parses torch's headers twice (device and host pass) for a few dozen lines of kernel:
most of a build's time. Split, the kernels go to a `.cu` that includes only CUDA's headers, and the
wrappers go to the C++ file, which g++ compiles against the precompiled `torch/extension.h`. What is
built is the same code: each launch `k<<<cfg>>>(args)` in a wrapper becomes a call of a generated
launcher `kforge_launch_k(kforge_launch_config(cfg), args)`, which the `.cu` defines and which runs
`k<<<cfg>>>(args)` itself, converting the arguments exactly as the launch would.

The split works on top-level declarations (brace-matched, comments and literals skipped):
  * a declaration with `__global__`/`__device__`/`__constant__`/`__shared__`/`__managed__` -> `.cu`;
  * a type, `using`/`typedef`, or constant -> both files (types may be kernel parameters);
  * everything else (the wrappers, host helpers) -> the C++ file;
  * preprocessor lines -> both, in order (torch/ATen/c10/pybind11 includes: the C++ file only).
It declines (returns why) rather than guess: template kernels launched from host code, device code that
names torch, host code that uses a kernel or a device symbol other than by launching it, namespaces.
A split that does not compile is rebuilt unsplit by the caller, so declining wrongly costs time, never
a wrong build. Every piece that is verbatim candidate text is kept with its original, so compiler
messages still point at the candidate's lines (rewritten launches keep their line count).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["GENERATED", "Split", "SplitDeclined", "split_cuda_sources"]

GENERATED = "\0kforge-generated"  # the "as written" text of generated pieces: found nowhere in a candidate

_DEVICE_WORDS = re.compile(r"\b(__global__|__device__|__constant__|__shared__|__managed__)\b")
_TORCH_WORDS = re.compile(r"\b(torch|at|c10|pybind11|py)\s*::|\b(TORCH_\w+|AT_\w+|C10_\w+|PYBIND11_\w+)\b|\bTensor\b|"
                          r"\bnamespace\s+(torch|at|c10|pybind11|py)\b")
_HOST_ONLY_INCLUDE = re.compile(r"#\s*include\s*[<\"](torch|ATen|c10|pybind11|THC)/")
_SHARED_START = re.compile(r"(template\s*<[^{;]*>\s*)?(struct|class|union|enum|typedef|using)\b|namespace\s+\w+\s*=|"
                           r"(template\s*<[^{;]*>\s*)?(static\s+)?(inline\s+)?constexpr\b|"
                           r"(static\s+)?(constexpr|const)\b[^({]*(=|;)\s*$|(static\s+)?(constexpr|const)\b[^(]*\{[^}]*\}\s*;\s*$")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_TYPE_WORDS = {"int", "float", "double", "char", "bool", "void", "long", "short", "unsigned", "signed", "const",
               "volatile", "__restrict__", "restrict", "size_t", "half", "__half", "auto"}
# Headers torch's own would have pulled in for the kernels (std::min, INFINITY, int64_t, printf, half).
_DEVICE_PRELUDE = """#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cfloat>
#include <climits>
#include <algorithm>
#include <type_traits>"""
_LAUNCH_CONFIG = """struct kforge_launch_config {  // grid, block, dynamic shared bytes and stream of a kernel launch
    dim3 grid, block; size_t smem; cudaStream_t stream;
    kforge_launch_config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0) : grid(g), block(b), smem(s), stream(st) {}
};"""


class SplitDeclined(ValueError):
    """The source is one the split does not handle; the message says why."""


@dataclass
class Split:
    """The two files' pieces, each with the candidate text it came from (GENERATED where none)."""

    cuda: list[str] = field(default_factory=list)
    cuda_written: list[str] = field(default_factory=list)
    cpp: list[str] = field(default_factory=list)  # goes after the candidate's own cpp_sources
    cpp_written: list[str] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)  # the kernels launched through generated launchers

    def add(self, where: str, piece: str, written: str | None = None) -> None:
        getattr(self, where).append(piece)
        getattr(self, f"{where}_written").append(piece if written is None else written)


@dataclass
class _Kernel:
    name: str
    params: list[str]
    is_template: bool


def _chunks(text: str) -> list[tuple[str, str]]:
    """Top-level pieces of `text` as (kind, text): "pp" for a preprocessor line, "decl" for a declaration.

    Comments and blank space between declarations are kept at the front of the next piece, so the
    pieces put together are `text` again.
    """
    out: list[tuple[str, str]] = []
    i, start, depth, n = 0, 0, 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
            continue
        if c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        if c in "\"'":
            if c == '"' and i > 0 and text[i - 1] == "R":  # raw string R"delim( ... )delim"
                m = re.match(r'"([^(\s]*)\(', text[i:])
                end = text.find(")" + (m.group(1) if m else "") + '"', i) if m else -1
                i = n if end < 0 else end + len(m.group(1)) + 2
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if c == "#" and at_line_start and depth == 0:
            if _code_only(text[start:i]).strip():  # a directive inside a declaration (e.g. between its lines)
                raise SplitDeclined("a preprocessor line inside a top-level declaration")
            end = i
            while True:  # the directive, with its continuation lines
                end = text.find("\n", end)
                if end < 0 or text[end - 1] != "\\":
                    break
                end += 1
            end = n if end < 0 else end
            out.append(("pp", text[start:end]))
            i = start = end
            continue
        if not c.isspace():
            at_line_start = False
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                raise SplitDeclined("unbalanced braces")
            if depth == 0:
                m = re.match(r"\s*;", text[i + 1:])  # struct S {...};
                tail = text[i + 1:].lstrip(" \t")
                if m and not _IDENT.match(tail):
                    i += 1 + m.end()
                elif _IDENT.match(tail):  # struct S {...} s; : the declaration goes on
                    i += 1
                    continue
                else:
                    i += 1
                out.append(("decl", text[start:i]))
                start = i
                continue
        elif c == ";" and depth == 0:
            out.append(("decl", text[start:i + 1]))
            start = i + 1
        i += 1
    if depth != 0:
        raise SplitDeclined("unbalanced braces")
    if text[start:].strip():
        out.append(("decl", text[start:]))
    elif text[start:]:
        out.append(("space", text[start:]))
    return out


def _code_only(text: str) -> str:
    """`text` with comments and string literals blanked (keywords inside them do not count)."""
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(\\.|[^"\\\n])*"|\'(\\.|[^\'\\\n])*\'',
                  lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def _matching(text: str, i: int, open_: str, close: str) -> int:
    """The index just past the bracket that closes the one at `text[i]`."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    raise SplitDeclined(f"unbalanced {open_}{close}")


def _split_top_commas(text: str) -> list[str]:
    """A parameter list's parameters (commas inside brackets or template arguments do not split)."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def _kernel(code: str) -> _Kernel | None:
    """The kernel a `__global__` declaration declares: its name and parameters."""
    if not re.search(r"\b__global__\b", code):
        return None
    body = code.find("{")
    head = code[:body] if body >= 0 else code.rstrip().rstrip(";")
    close = head.rstrip().rfind(")")
    if close < 0:
        raise SplitDeclined("a kernel without a parameter list")
    depth, open_at = 0, -1
    for j in range(close, -1, -1):
        depth += {")": 1, "(": -1}.get(head[j], 0)
        if depth == 0:
            open_at = j
            break
    names = _IDENT.findall(head[:open_at])
    if not names:
        raise SplitDeclined("a kernel without a name")
    params = [p.strip() for p in _split_top_commas(head[open_at + 1:close])]
    if params == ["void"]:
        params = []
    return _Kernel(names[-1], params, bool(re.match(r"\s*template\b", head)))


def _param_name(param: str, kernel: str) -> str:
    if "=" in param or "[" in param or "(" in param:
        raise SplitDeclined(f"kernel {kernel}: parameter '{param}' (a default value, array or function pointer)")
    words = _IDENT.findall(param)
    if len(words) < 2 or words[-1] in _TYPE_WORDS or param.rstrip().endswith(("*", "&")):
        raise SplitDeclined(f"kernel {kernel}: an unnamed parameter '{param}'")
    return words[-1]


def _launcher(k: _Kernel) -> tuple[str, str]:
    """The launcher's declaration (for the C++ file) and definition (for the .cu)."""
    names = [_param_name(p, k.name) for p in k.params]
    sig = f"void kforge_launch_{k.name}(kforge_launch_config kforge_cfg{''.join(', ' + p for p in k.params)})"
    body = (f"{sig} {{\n    {k.name}<<<kforge_cfg.grid, kforge_cfg.block, kforge_cfg.smem, kforge_cfg.stream>>>"
            f"({', '.join(names)});\n}}")
    return sig + ";", body


_LAUNCH = re.compile(r"\b([A-Za-z_]\w*)\s*(<[^<>;{}]*>)?\s*<<<")


def _rewrite_launches(code: str, original: str, kernels: dict[str, _Kernel]) -> tuple[str, set[str]]:
    """`original` with each `k<<<cfg>>>(args)` made `kforge_launch_k(kforge_launch_config(cfg), args)`.

    Found on `code` (comments and strings blanked, same offsets); line count and other text unchanged.
    """
    out, used, pos = [], set(), 0
    for m in _LAUNCH.finditer(code):
        if m.start() < pos:
            continue
        name = m.group(1)
        k = kernels.get(name)
        if k is None:
            raise SplitDeclined(f"host code launches '{name}', which is not a kernel of this source")
        if k.is_template or m.group(2):
            raise SplitDeclined(f"host code launches the template kernel '{name}'")
        cfg_end = code.find(">>>", m.end())
        paren = -1 if cfg_end < 0 else cfg_end + 3 + (len(code[cfg_end + 3:]) - len(code[cfg_end + 3:].lstrip()))
        if paren < 0 or paren >= len(code) or code[paren] != "(":
            raise SplitDeclined(f"a launch of '{name}' that is not `{name}<<<...>>>(...)`")
        args_end = _matching(code, paren, "(", ")")
        cfg, args = original[m.end():cfg_end], original[paren + 1:args_end - 1]
        sep = ", " if args.strip() else ""
        out += [original[pos:m.start()], f"kforge_launch_{name}(kforge_launch_config({cfg}){sep}{args})"]
        used.add(name)
        pos = args_end
    out.append(original[pos:])
    return "".join(out), used


def _declared_name(code: str) -> str | None:
    """The name a device declaration introduces (a function's, or a variable's)."""
    body = code.find("{")
    head = code[:body] if body >= 0 else code
    paren = head.find("(")
    if paren >= 0 and not re.search(r"__launch_bounds__\s*$", head[:paren]):
        names = _IDENT.findall(head[:paren])
    else:
        names = _IDENT.findall(re.split(r"[\[=;]", head)[0])
    return names[-1] if names else None


def split_cuda_sources(cuda_sources: list[str]) -> Split:
    """The split of `cuda_sources` (see the module docstring). Raises SplitDeclined with why not."""
    text = "\n".join(cuda_sources)
    if re.search(r"\bnamespace(\s+\w+)?\s*\{|\bextern\s+\"C\"\s*\{", _code_only(text)):
        raise SplitDeclined("a namespace or extern \"C\" block")
    split = Split()
    split.add("cuda", _DEVICE_PRELUDE + "\n" + _LAUNCH_CONFIG, GENERATED)
    split.add("cpp", "#include <cuda.h>\n#include <cuda_runtime.h>\n" + _LAUNCH_CONFIG, GENERATED)
    kernels: dict[str, _Kernel] = {}
    device_names: set[str] = set()
    host_pieces: list[tuple[int, str, str]] = []  # (index in split.cpp, code, original) to rewrite at the end
    declared_launchers: set[str] = set()
    for kind, piece in _chunks(text):
        code = _code_only(piece)
        if kind == "space":
            continue
        if kind == "pp":
            if not _HOST_ONLY_INCLUDE.search(code):
                split.add("cuda", piece)
            split.add("cpp", piece)
            continue
        if _DEVICE_WORDS.search(code):
            if _TORCH_WORDS.search(code):
                raise SplitDeclined("device code names torch (torch::, at::, c10::, Tensor): it needs torch's headers")
            split.add("cuda", piece)
            k = _kernel(code)
            if k is not None:
                kernels.setdefault(k.name, k)
                if not k.is_template:
                    declaration, definition = _launcher(k)
                    if k.name not in declared_launchers:
                        split.add("cpp", declaration, GENERATED)
                        declared_launchers.add(k.name)
                    if "{" in code:
                        split.add("cuda", definition, GENERATED)
            elif (name := _declared_name(code)) is not None:
                device_names.add(name)
            continue
        if _SHARED_START.match(code.strip()) and not _TORCH_WORDS.search(code):
            split.add("cuda", piece)
            split.add("cpp", piece)
            continue
        host_pieces.append((len(split.cpp), code, piece))
        split.add("cpp", piece)
    device_symbols = sorted(set(kernels) | device_names)
    device_symbol = re.compile(r"\b(" + "|".join(map(re.escape, device_symbols)) + r")\b") if device_symbols else None
    for index, code, piece in host_pieces:
        rewritten, used = _rewrite_launches(code, piece, kernels)
        if device_symbol and (m := device_symbol.search(_code_only(rewritten))):
            raise SplitDeclined(f"host code uses '{m.group(1)}' other than by launching it (a device symbol)")
        split.cpp[index] = rewritten
        split.kernels += sorted(used - set(split.kernels))
    if not split.kernels:
        raise SplitDeclined("no kernel is launched from host code in this source")
    return split
