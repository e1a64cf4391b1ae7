"""The analyst's result models (`Analysis`, `Recommendation`, `Evidence`) and its provider interface.

An analyst reads one `ProfileReport` (or pasted profiler text) and says what limits the candidate and
what to change first. Providers are found by name through `load_provider`, imported on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from kforge.profilers.compiler_report import CompilerFacts
from kforge.profilers.report import ProfileReport

__all__ = ["Analysis", "AnalystProvider", "Bottleneck", "Evidence", "PROVIDERS", "Recommendation", "load_provider"]

_FROZEN = ConfigDict(frozen=True)

Bottleneck = Literal["memory-bound", "compute-bound", "latency-bound", "launch-bound", "framework-bound",
                     "host-bound", "unknown"]
Confidence = Literal["high", "medium", "low"]

# Name -> "module:Class". Imported on first use so a provider's dependencies cost nothing until asked for.
PROVIDERS: dict[str, str] = {"rules": "kforge.profilers.analyst.rules:RulesAnalyst"}

# __str__ stays a short summary: this many recommendations and notes, the rest are in the fields.
_STR_RECOMMENDATIONS = 3
_STR_NOTES = 2


class Evidence(BaseModel):
    """One measured fact a conclusion rests on, with the threshold it was judged against."""

    model_config = _FROZEN

    metric: str = Field(description="What was measured, e.g. 'custom_share', 'speedup_vs_eager', 'IPC'.")
    value: float | str
    judged_against: str | None = Field(default=None, description="The threshold in words, e.g. '< 0.5 (half of op time)'.")
    source: str = Field(description="Where the fact came from: 'timing', 'torch.profiler', 'perf', 'ncu', 'text'.")

    def __str__(self) -> str:
        value = f"{self.value:.3g}" if isinstance(self.value, float) else str(self.value)
        against = f" (judged against {self.judged_against})" if self.judged_against else ""
        return f"{self.metric} = {value}{against} [{self.source}]"


class Recommendation(BaseModel):
    """One ranked change to make, with where, why, its expected effect and the evidence for it."""

    model_config = _FROZEN

    rank: int = Field(ge=1, description="1 = do this first.")
    title: str = Field(description="Short imperative.")
    action: str = Field(description="What to change, concretely.")
    where: str | None = Field(default=None, description="Op or kernel name, or 'line N' of the candidate when known.")
    why: str
    expected_effect: str
    confidence: Confidence
    evidence: list[Evidence] = Field(default_factory=list)

    def __str__(self) -> str:
        where = f" ({self.where})" if self.where else ""
        return f"{self.rank}. {self.title}{where} [{self.confidence}]: {self.action}"


class Analysis(BaseModel):
    """The analyst's verdict: the bottleneck with its evidence, ranked recommendations, changes and caveats."""

    model_config = _FROZEN

    provider: str
    bottleneck: Bottleneck
    bottleneck_why: str
    evidence: list[Evidence] = Field(default_factory=list)
    recommendations: list[Recommendation] = Field(default_factory=list, description="Ranked, rank 1 first.")
    changes: list[str] = Field(default_factory=list, description="What changed against the previous profile, when one was given.")
    notes: list[str] = Field(default_factory=list, description="Caveats: noisy timing, missing counters, parsed text.")

    def __str__(self) -> str:
        """The bottleneck, the top recommendations one line each, then changes and caveats.

        Example::

            Bottleneck: framework-bound (the candidate's own kernels take 12% of op time; ...)
              1. Move aten::mul into your kernel (aten::mul) [high]: ...
              note: timing is noisy: IQR is 14% of the median
        """
        lines = [f"Bottleneck: {self.bottleneck} ({self.bottleneck_why})"]
        lines += [f"  {r}" for r in self.recommendations[:_STR_RECOMMENDATIONS]]
        if not self.recommendations:
            lines.append("  No recommendation: nothing in this profile stands out.")
        if self.changes:
            lines.append(f"  since previous: {'; '.join(self.changes[:2])}")
        lines += [f"  note: {n}" for n in self.notes[:_STR_NOTES]]
        hidden = max(0, len(self.recommendations) - _STR_RECOMMENDATIONS) + max(0, len(self.notes) - _STR_NOTES)
        if hidden:
            lines.append(f"  ... and {hidden} more recommendations/notes in the structured result")
        return "\n".join(lines)


class AnalystProvider(Protocol):
    """What every analyst implements: one report (or pasted text) in, one `Analysis` out."""

    name: str

    def analyze(self, report: ProfileReport | None, *, text: str | None = None, code: str | None = None,
                previous: ProfileReport | None = None, compiler: CompilerFacts | None = None) -> Analysis:
        """Analyse `report`, or `text` parsed when `report` is None; `code` is read (loops, pragmas, kernels) and
        locates lines, `compiler` holds what the compilers reported, `previous` gives changes."""
        ...


def load_provider(name: str) -> AnalystProvider:
    """Instantiate the analyst registered as `name`.

    Raises:
        KeyError: `name` is not registered; the message lists the known names.
    """
    target = PROVIDERS.get(name)
    if target is None:
        raise KeyError(f"unknown analyst {name!r}; known analysts: {', '.join(sorted(PROVIDERS))}")
    module_name, _, class_name = target.partition(":")
    return getattr(import_module(module_name), class_name)()
