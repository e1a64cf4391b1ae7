"""What the compiler said about the candidate's code: vectorizer remarks, imported math symbols, GPU resources.

Collected during the normal build (no extra build): GCC writes its vectorizer report to a file in the
build directory (`-fopt-info-vec-optimized-missed=...`, flags from `backends.cpu.vectorizer_flags`), clang
prints `-Rpass` remarks into the build log, ptxas prints `-Xptxas -v` resources, Triton keeps them in
the compiled kernel's metadata. The build capture (`kforge.backends.build.inline`) fills these models, which
are part of a build's result; the analyst reads them through `kforge.profilers.compiler_report`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CANDIDATE_ARTIFACT", "VEC_REPORT_FILE", "CompilerFacts", "CompilerReport", "KernelResources", "LoopRemark", "RawRemark",
           "imported_math", "loop_remarks", "parse_vectorizer_remarks", "widest_vector_bytes"]

_FROZEN = ConfigDict(frozen=True)

# GCC appends its vectorizer report here, relative to the build directory (ninja compiles there); the cpu backend's
# flags name it, the build capture reads it.
VEC_REPORT_FILE = "kforge-vec.txt"
# A profile's copy of the candidate's source (an artifact), so the analyst can read the code it profiled.
CANDIDATE_ARTIFACT = "candidate.py"
# Remarks kept per build: a candidate's own loops give a handful; torch's headers give thousands (dropped).
MAX_LOOP_REMARKS = 60

# libm functions whose scalar call in a loop stops GCC from vectorizing it (without -ffast-math, glibc
# declares no SIMD variants), and which cost tens of cycles each.
MATH_FUNCTIONS = ("exp", "expf", "exp2", "exp2f", "expm1", "expm1f", "log", "logf", "log2", "log2f", "log1p",
                  "log1pf", "pow", "powf", "tanh", "tanhf", "sin", "sinf", "cos", "cosf", "erf", "erff", "sqrt",
                  "sqrtf", "atan2", "atan2f", "sigmoid")


class KernelResources(BaseModel):
    """What the GPU compiler reported about one kernel (ptxas -v, or Triton's compiled metadata)."""

    model_config = _FROZEN

    kernel: str = Field(description="Kernel name (demangled where possible).")
    registers: int | None = Field(default=None, description="Registers per thread.")
    shared_bytes: int | None = Field(default=None, description="Static shared memory per block.")
    spill_store_bytes: int | None = None
    spill_load_bytes: int | None = None
    stack_bytes: int | None = Field(default=None, description="Stack frame per thread (local memory).")
    local_bytes: int | None = Field(default=None, description="Local memory per thread as the driver reports it "
                                    "(spills plus stack); Triton kernels report this.")
    arch: str | None = None
    num_warps: int | None = Field(default=None, description="Triton only.")
    num_stages: int | None = Field(default=None, description="Triton only.")

    def __str__(self) -> str:
        parts = [f"{label} {value}" for label, value in (
            ("registers", self.registers), ("smem B", self.shared_bytes), ("spill stores B", self.spill_store_bytes),
            ("local B", self.local_bytes), ("stack B", self.stack_bytes), ("warps", self.num_warps),
            ("stages", self.num_stages)) if value is not None]
        return f"{self.kernel}: {', '.join(parts) or 'no resource data'}"


class LoopRemark(BaseModel):
    """The vectorizer's verdict on the loops of one line of the candidate."""

    model_config = _FROZEN

    line: int | None = Field(description="1-based line in the candidate's text; None when it could not be mapped.")
    origin: str = Field(description="Where the compiler pointed, e.g. 'main.cpp:23'.")
    vectorized: bool = Field(description="True when a loop of this line was vectorized.")
    vector_bytes: int | None = Field(default=None, description="Width of the vectors used, when vectorized.")
    missed: list[str] = Field(default_factory=list, description="Why a loop of this line was not vectorized.")

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else self.origin
        if self.vectorized:
            return f"{where}: vectorized ({self.vector_bytes or '?'}-byte vectors)" + (
                f"; another loop not: {self.missed[0]}" if self.missed else "")
        return f"{where}: not vectorized: {self.missed[0] if self.missed else 'no reason given'}"


class CompilerReport(BaseModel):
    """One C++ build's compiler report, reduced to the candidate's own loops and the math it calls."""

    model_config = _FROZEN

    build: str = Field(description="The load_inline name.")
    compiler: str = Field(description="'gcc' or 'clang'.")
    loops: list[LoopRemark] = Field(default_factory=list)
    scalar_math: list[str] = Field(default_factory=list, description="libm functions the built library imports as "
                                   "scalar calls (nm -D), e.g. 'expf': one call per element in a loop.")
    vector_math: list[str] = Field(default_factory=list, description="Vector math variants it imports (libmvec "
                                   "_ZGV* symbols): those calls were vectorized.")
    blocking_calls: list[str] = Field(default_factory=list, description="Calls the vectorizer named as stopping a "
                                      "loop (e.g. '__builtin_expf').")
    host_vector_bytes: int | None = Field(default=None, description="Widest SIMD registers of the build host "
                                          "(16 SSE, 32 AVX2, 64 AVX-512).")

    def __str__(self) -> str:
        parts = [str(loop) for loop in self.loops[:4]]
        if self.scalar_math:
            parts.append(f"scalar libm calls: {', '.join(self.scalar_math)}")
        return f"{self.build} ({self.compiler}): " + ("; ".join(parts) or "no loop remarks")


class CompilerFacts(BaseModel):
    """Everything the compilers said about one candidate: C++ reports and GPU kernel resources."""

    model_config = _FROZEN

    builds: list[CompilerReport] = Field(default_factory=list)
    kernels: list[KernelResources] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.builds and not self.kernels


class RawRemark(BaseModel):
    """One remark as the compiler printed it, before its line is mapped into the candidate."""

    model_config = _FROZEN

    file: str
    line: int
    kind: Literal["optimized", "missed"]
    message: str


# gcc: "main.cpp:12:64: missed: couldn't vectorize loop"; clang: "main.cpp:12:5: remark: vectorized loop ..."
_GCC_REMARK = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)?\s*(?P<kind>optimized|missed):\s*(?P<msg>.*)$")
_CLANG_REMARK = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)?\s*remark:\s*(?P<msg>.*?)\s*"
                           r"\[-Rpass(?P<missed>-missed|-analysis)?=loop-vectorize\]$")
_VECTOR_BYTES = re.compile(r"using (\d+) byte vectors")
_CLANG_WIDTH = re.compile(r"vectorization width: (\d+)")
_BUILTIN_CALL = re.compile(r"__builtin_(\w+) \(")
# Missed remarks that say nothing about the candidate's loop (GCC prints them for every call it meets).
_NOISE = ("statement clobbers memory", "splitting region", "vectorization is not profitable",
          "statement can throw an exception", "unsupported data-type", "no vectype", "bad loop form",
          "loop nest containing two or more consecutive inner loops", "multiple nested loops",
          "more than one data ref in stmt")


def parse_vectorizer_remarks(text: str) -> tuple[list[RawRemark], list[str]]:
    """(remarks on any file, math calls the vectorizer named as blocking) from GCC or clang output."""
    remarks: list[RawRemark] = []
    blocking: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if m := _GCC_REMARK.match(line):
            msg = m.group("msg").strip()
            call = _BUILTIN_CALL.search(msg)
            if call and call.group(1).rstrip("f") in {f.rstrip("f") for f in MATH_FUNCTIONS}:
                blocking.append(f"__builtin_{call.group(1)}")
            reason = msg.removeprefix("not vectorized: ")
            if m.group("kind") == "missed" and (reason.startswith(_NOISE) or not (
                    msg == "couldn't vectorize loop" or msg.startswith("not vectorized"))):
                continue
            if m.group("kind") == "optimized" and "loop vectorized" not in msg:
                continue
            remarks.append(RawRemark(file=m.group("file"), line=int(m.group("line")), kind=m.group("kind"), message=msg))
        elif m := _CLANG_REMARK.match(line):
            kind = "missed" if m.group("missed") else "optimized"
            remarks.append(RawRemark(file=m.group("file"), line=int(m.group("line")), kind=kind,
                                     message=m.group("msg").strip()))
    return remarks, sorted(set(blocking))


def loop_remarks(remarks: list[tuple[int | None, str, RawRemark]]) -> list[LoopRemark]:
    """Group (candidate line, origin, remark) by line into one verdict per line."""
    by_line: dict[tuple[int | None, str], list[RawRemark]] = {}
    for line, origin, remark in remarks:
        by_line.setdefault((line, origin if line is None else ""), []).append(remark)
    out = []
    for (line, origin), items in sorted(by_line.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        done = [r for r in items if r.kind == "optimized" and ("vectorized" in r.message)]
        widths = [int(m.group(1)) for r in done if (m := _VECTOR_BYTES.search(r.message))]
        widths += [4 * int(m.group(1)) for r in done if (m := _CLANG_WIDTH.search(r.message))]  # fp32 lanes
        # "couldn't vectorize loop" only says that; the reason is the next "not vectorized: ..." remark.
        reasons = [r.message.removeprefix("not vectorized: ") for r in items if r.kind == "missed"
                   and r.message != "couldn't vectorize loop"]
        if not done and not reasons and any(r.kind == "missed" for r in items):
            reasons = ["couldn't vectorize loop"]
        if not done and not reasons:
            continue
        first_origin = origin or f"{Path(items[0].file).name}:{items[0].line}"
        out.append(LoopRemark(line=line, origin=first_origin, vectorized=bool(done),
                              vector_bytes=max(widths) if widths else None, missed=list(dict.fromkeys(reasons))[:3]))
    return out[:MAX_LOOP_REMARKS]


_MATH_SYMBOL = re.compile(r"^\s*U\s+(?P<name>[\w.]+?)(?:@+(?P<ver>\S+))?$")


def imported_math(library: Path) -> tuple[list[str], list[str]]:
    """(scalar libm functions, libmvec vector variants) that `library` imports, by `nm -D --undefined-only`.

    A scalar `expf` import in a kernel whose loops call exp is one call per element; `_ZGVdN8v_expf`
    is GCC's AVX2 variant from glibc's libmvec, i.e. the loop was vectorized with vector exp.
    """
    nm = shutil.which("nm")
    if nm is None or not library.exists():
        return [], []
    try:
        out = subprocess.run([nm, "-D", "--undefined-only", str(library)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return [], []
    scalar, vector = set(), set()
    for line in out.stdout.splitlines():
        m = _MATH_SYMBOL.match(line)
        if m is None:
            continue
        name = m.group("name")
        if name.startswith("_ZGV"):
            vector.add(name)
        elif name in MATH_FUNCTIONS:
            scalar.add(name)
    return sorted(scalar), sorted(vector)


def widest_vector_bytes() -> int | None:
    """The widest SIMD registers this x86 host has (64 AVX-512, 32 AVX/AVX2, 16 SSE); None off x86 Linux."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), None)
    except OSError:
        return None
    if flags is None:
        return None
    if "avx512f" in flags:
        return 64
    if "avx2" in flags or "avx" in flags:
        return 32
    return 16 if "sse2" in flags else None
