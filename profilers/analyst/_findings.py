"""What rules produce before ranking: draft recommendations and the collected claims, evidence and notes."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._hardware import Claim
from .base import Evidence

__all__ = ["CONFIDENCE_WEIGHT", "Draft", "Findings"]

# Expected effect counts for less when the rule is less sure: ranking uses gain x weight.
CONFIDENCE_WEIGHT = {"high": 1.0, "medium": 0.7, "low": 0.4}


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
