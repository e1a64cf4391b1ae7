"""What rules produce before ranking: draft recommendations and the collected claims, evidence and notes,
and the measurements every code rule weighs its drafts by."""

from __future__ import annotations

from dataclasses import dataclass, field

from kforge.profilers.report import ProfileReport

from ._hardware import BANDWIDTH_CEILING_FRACTION, Claim
from .base import Evidence

__all__ = ["CONFIDENCE_WEIGHT", "MEMORY_CLAIM_MIN_FRACTION", "PRIORITY_CODE", "ROOFLINE_BANDWIDTH", "ROOFLINE_COMPUTE",
           "UNCONFIRMED_WEIGHT", "memory_claim", "Draft", "Findings", "own_share", "pct", "roofline_evidence"]

# Expected effect counts for less when the rule is less sure: ranking uses gain x weight.
CONFIDENCE_WEIGHT = {"high": 1.0, "medium": 0.7, "low": 0.4}
# A change that pays only in a bottleneck class the analysis did not find: its gain is this much as likely.
UNCONFIRMED_WEIGHT = 0.5
# Above this fraction of the measured copy bandwidth or matmul rate, the ceiling is what limits.
ROOFLINE_BANDWIDTH = BANDWIDTH_CEILING_FRACTION
ROOFLINE_COMPUTE = 0.6
# A walk that uses one float of each 64-byte cache line moves at most 16x the bytes the timing counts. Below the
# bandwidth ceiling / 16 the timed call is far from the ceiling even so: the timing does not show memory as the
# limit, and a memory class from the code's shape alone is not asserted.
MEMORY_CLAIM_MIN_FRACTION = ROOFLINE_BANDWIDTH / 16
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
    # The class whose loops the change speeds up ('compute-bound': wider vectors); where the analysis found
    # another class, or none, its expected gain counts for less (`UNCONFIRMED_WEIGHT`).
    needs: str | None = None

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
    # Why a class the code's shape suggests was not claimed (the measurements do not show it), for the verdict.
    withheld: list[str] = field(default_factory=list)


def memory_claim(report: ProfileReport | None, out: Findings, claim: Claim) -> None:
    """Claim memory-bound from the code's shape unless the timed call's traffic says memory is not the limit: then
    say so instead, for the verdict to name what the measurements show."""
    bw = report.bandwidth_fraction if report is not None else None
    if bw is None or bw >= MEMORY_CLAIM_MIN_FRACTION:
        out.claims.append(claim)
        return
    said = (f"the timed call moves its inputs and outputs at {100 * bw:.2g}% of the measured copy bandwidth, under "
            f"{pct(MEMORY_CLAIM_MIN_FRACTION)} (a sixteenth of the ceiling: one float per 64-byte line read would still "
            "be far from it), so the timing does not show memory as the limit")
    if said not in out.withheld:
        out.withheld.append(said)


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
