"""What rules produce before ranking: draft recommendations and the collected claims, evidence and notes,
and the measurements every code rule weighs its drafts by."""

from __future__ import annotations

from dataclasses import dataclass, field

from kforge.profilers.report import ProfileReport

from ._hardware import BANDWIDTH_CEILING_FRACTION, Claim
from .base import Evidence

__all__ = ["CONFIDENCE_WEIGHT", "PRIORITY_CODE", "ROOFLINE_BANDWIDTH", "ROOFLINE_COMPUTE", "Draft", "Findings", "own_share", "pct", "roofline_evidence"]

# Expected effect counts for less when the rule is less sure: ranking uses gain x weight.
CONFIDENCE_WEIGHT = {"high": 1.0, "medium": 0.7, "low": 0.4}
# Above this fraction of the measured copy bandwidth or matmul rate, the ceiling is what limits.
ROOFLINE_BANDWIDTH = BANDWIDTH_CEILING_FRACTION
ROOFLINE_COMPUTE = 0.6
# Claims from the code rank after Nsight Compute's (which measures the kernel) and beside perf's.
PRIORITY_CODE = 5


@dataclass
class Draft:
    """A recommendation before ranking.

    `affected` is the share of time it addresses; `gain` the share of the candidate's time it is
    expected to save (defaults to `affected`); `located` marks advice tied to a line of the code.
    """

    title: str
    action: str
    where: str | None
    why: str
    expected_effect: str
    confidence: str
    evidence: list[Evidence]
    affected: float
    speed_based: bool = False
    gain: float | None = None
    located: bool = False
    generic: bool = False  # a text by bottleneck class, not about this code: yields to located findings
    # A located change of small expected effect (a `__restrict__`): it does not displace the texts by a
    # measured bottleneck class, only the 'unknown' one, which asks for a measurement the notes already name.
    hint: bool = False

    @property
    def expected_gain(self) -> float:
        return self.affected if self.gain is None else self.gain


@dataclass
class Findings:
    claims: list[Claim] = field(default_factory=list)
    drafts: list[Draft] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Features not to advise though the code lacks them, with why (a parallel region on a 5 us call).
    avoid: dict[str, str] = field(default_factory=dict)


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def own_share(report: ProfileReport | None) -> float:
    """The share of time the candidate's own code holds: what code changes can save."""
    if report is None or report.custom_share is None:
        return 1.0
    return max(0.0, min(1.0, report.custom_share))


def roofline_evidence(report: ProfileReport | None) -> list[Evidence]:
    """The timed bytes and FLOPs against the device's measured ceilings: the same facts wherever a rule cites them,
    so the analysis lists each once."""
    ev = []
    if report is not None and report.bandwidth_fraction is not None:
        ev.append(Evidence(metric="bandwidth_fraction", value=report.bandwidth_fraction,
                           judged_against=f">= {ROOFLINE_BANDWIDTH:g} of the measured copy bandwidth is at the ceiling",
                           source="timing"))
    if report is not None and report.compute_fraction is not None:
        ev.append(Evidence(metric="compute_fraction", value=report.compute_fraction,
                           judged_against=f">= {ROOFLINE_COMPUTE:g} of the measured matmul rate is at the ceiling",
                           source="timing"))
    return ev
