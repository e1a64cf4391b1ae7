"""What a build produced, as data: its messages located in the candidate, and one record per build.

These live with the build machinery that makes them (backends import nothing above them); `kforge.tools.models`
puts them in the tools' results.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .compiler_report import CompilerReport, KernelResources

__all__ = ["BuildInfo", "CompilerReport", "Diagnostic", "KernelResources"]

_FROZEN = ConfigDict(frozen=True)


class Diagnostic(BaseModel):
    """One compiler or interpreter message, located in the candidate's own text where possible."""

    model_config = _FROZEN

    severity: Literal["error", "warning", "note"]
    message: str
    line: int | None = Field(default=None, description="1-based line in the candidate's text.")
    column: int | None = None
    source: str = Field(description="Who said it: 'python', 'c++', 'cuda', 'linker', 'triton'.")
    origin: str | None = Field(default=None, description="Where the tool pointed, e.g. 'main.cpp:14:7'.")
    code_line: str | None = Field(default=None, description="The candidate's line the message points at.")

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else (self.origin or "?")
        return f"{where}: {self.severity}: {self.message}"


class BuildInfo(BaseModel):
    """One build the candidate made (a `load_inline` call, an NVRTC kernel)."""

    model_config = _FROZEN

    name: str
    ok: bool
    seconds: float
    from_cache: bool = Field(description="True when a previous build of the same sources and flags was reused.")
    functions: list[str] = Field(default_factory=list)
    kernels: list[KernelResources] = Field(default_factory=list, description="Per-kernel resource usage (GPU builds).")
    fast_paths: list[str] = Field(default_factory=list, description="What made a fresh build faster than plain "
                                  "load_inline: 'NVRTC', 'kernels split from torch wrappers', 'lean CUDA header "
                                  "(torch/types.h)', 'precompiled header'.")
    not_split: str | None = Field(None, description="Why this CUDA build's kernels were not compiled apart from its "
                                  "torch wrappers (the fast path for the KernelBench form); a template kernel launched "
                                  "from host code is the usual reason.")
    compiler_report: CompilerReport | None = Field(default=None, description="The C++ compiler's vectorizer report "
                                                   "on the candidate's loops and the scalar math calls it imports.")
