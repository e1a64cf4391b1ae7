"""Model-backed analysis: what a language model is asked, and how its answer becomes an `Analysis`.

Transport-free: the HTTP providers (`http.py`) and MCP sampling (the server) send `AnalystRequest`
and hand the reply text to `parse_answer`. The model gets the normalized metrics and the rules'
findings as well as the raw text and images, so it starts from what the rules already know. An answer
that is not the asked-for JSON, or names no recommendation, is rejected (ValueError), and the caller
falls back to the rules with `fallback`.
"""

from __future__ import annotations

import json
import re
import typing
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, ValidationError, field_validator

from kforge.profilers.compiler_report import CompilerFacts
from kforge.profilers.report import ProfileReport
from kforge.resources.templates import render

from .base import Analysis, Bottleneck, Evidence, Recommendation
from .code_rules import advised_against
from .redundant import Present, already_present, prune
from .source import read_source

__all__ = ["AnalystRequest", "Image", "analyst_request", "fallback", "parse_answer"]

# Pasted text and code are cut to this many characters: enough for an ncu details page of a few
# kernels, small enough for a local model's context.
MAX_TEXT_CHARS = 24_000
MAX_CODE_CHARS = 12_000
_BOTTLENECKS = typing.get_args(Bottleneck)
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


@dataclass(frozen=True)
class Image:
    """A screenshot: its MIME type ('image/png', 'image/jpeg') and base64 data (no data: prefix)."""

    mime_type: str
    data: str


@dataclass(frozen=True)
class AnalystRequest:
    system: str
    user: str
    images: tuple[Image, ...] = field(default_factory=tuple)


def _numbered(code: str) -> str:
    return "\n".join(f"{i:4d}  {line}" for i, line in enumerate(code[:MAX_CODE_CHARS].splitlines(), start=1))


def _metrics_json(report: ProfileReport) -> str:
    """The facts a model needs, without the bulk (full op lists, every ncu launch)."""
    data = report.model_dump(mode="json", exclude_none=True, exclude={"notes"})
    data["ops"] = data.get("ops", [])[:12]
    data["ncu"] = data.get("ncu", [])[:3]
    return json.dumps(data, indent=1)


def _compiler_json(compiler: CompilerFacts | None) -> str | None:
    if compiler is None or compiler.empty:
        return None
    return json.dumps(compiler.model_dump(mode="json", exclude_none=True), indent=1)


def _not_to_advise(code: str | None, report: ProfileReport | None) -> dict[str, Present]:
    """What the code already has, and what the rules advise against (threads for a too-short call): the
    features a model's answer must not propose, as the rules' own drafts must not."""
    facts = read_source(code) if code else None
    present = already_present(facts, report)
    for feature, why in advised_against(report, facts).items():
        present.setdefault(feature, Present(feature, None, f"not worth adding: {why}"))
    return present


def _present_lines(code: str | None, report: ProfileReport | None) -> list[str]:
    """What the code already has (or must not get), in words, so the model does not propose it."""
    return [f"{p.feature}" + (f" (line {p.line}: {p.how})" if p.line else f" ({p.how})")
            for p in _not_to_advise(code, report).values()]


def analyst_request(report: ProfileReport | None, rules: Analysis | None, *, text: str | None = None,
                    code: str | None = None, previous: ProfileReport | None = None,
                    images: tuple[Image, ...] = (), compiler: CompilerFacts | None = None) -> AnalystRequest:
    """The request for a model analyst: deterministic for the same inputs (MCP sampling asks it twice).

    The model gets what the rules read: the measurements, the compilers' reports, the numbered source,
    what the code already has, and the rules' findings.
    """
    user = render("analyst_request.md.j2", metrics=_metrics_json(report) if report else None, rules=rules,
                  text=(text or "")[:MAX_TEXT_CHARS] or None, text_truncated=bool(text and len(text) > MAX_TEXT_CHARS),
                  images=len(images), code=_numbered(code) if code else None,
                  previous=_metrics_json(previous) if previous else None, compiler=_compiler_json(compiler),
                  present=_present_lines(code, report))
    return AnalystRequest(system=render("analyst_system.md.j2", bottlenecks=_BOTTLENECKS), user=user, images=images)


class _Evidence(BaseModel):
    metric: str
    value: float | str
    judged_against: str | None = None
    source: str = "model"


class _Recommendation(BaseModel):
    title: str
    action: str
    where: str | None = None
    why: str = ""
    expected_effect: str = ""
    confidence: typing.Literal["high", "medium", "low"] = "medium"

    @field_validator("confidence", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return v.strip().lower() if isinstance(v, str) else v


class _Answer(BaseModel):
    bottleneck: str
    bottleneck_why: str
    evidence: list[_Evidence] = Field(default_factory=list)
    recommendations: list[_Recommendation] = Field(min_length=1)
    notes: list[str] = Field(default_factory=list)


def parse_answer(reply: str, provider: str, rules: Analysis | None, *, code: str | None = None,
                 report: ProfileReport | None = None) -> Analysis:
    """The model's reply as an `Analysis`; ValueError says what was wrong with it.

    Recommendations that propose what the code already has (`redundant.prune`) are cut or dropped,
    as the rules' own are; an answer left with none is unusable.
    """
    match = _JSON_OBJECT.search(reply or "")
    if match is None:
        raise ValueError("the answer holds no JSON object")
    try:
        answer = _Answer.model_validate_json(match.group(0))
    except ValidationError as exc:
        raise ValueError(f"the answer does not fit the schema: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}") from None
    bottleneck = answer.bottleneck.strip().lower()
    notes = list(answer.notes)
    if bottleneck not in _BOTTLENECKS:
        notes.append(f"the model named the bottleneck {answer.bottleneck!r}, which is not a known class")
        bottleneck = "unknown"
    if rules is not None and rules.bottleneck != "unknown" and rules.bottleneck != bottleneck:
        notes.append(f"the rules engine found {rules.bottleneck} instead ({rules.bottleneck_why})")
    present = _not_to_advise(code, report)
    kept = []
    for r in answer.recommendations:
        action, said = prune(r.title, r.action, present)
        notes.extend(said)
        if action is not None:
            kept.append(r.model_copy(update={"action": action}))
    if not kept:
        raise ValueError("every recommendation proposed what the code already has (" + "; ".join(notes[-3:]) + ")")
    return Analysis(
        provider=provider, bottleneck=bottleneck, bottleneck_why=answer.bottleneck_why,  # type: ignore[arg-type]
        evidence=[Evidence(**e.model_dump()) for e in answer.evidence],
        recommendations=[Recommendation(rank=i, **r.model_dump()) for i, r in enumerate(kept, start=1)],
        changes=rules.changes if rules else [], notes=notes)


def fallback(rules: Analysis | None, provider: str, why: str) -> Analysis:
    """The rules' analysis, saying that the model analyst was asked and why its answer is not used."""
    note = f"the {provider} analyst was not used: {why}; these are the built-in rules' findings"
    if rules is None:
        return Analysis(provider="rules", bottleneck="unknown", bottleneck_why="nothing the built-in rules can read "
                        "(screenshots only) and no model answer", notes=[note])
    return rules.model_copy(update={"notes": [note, *rules.notes]})
