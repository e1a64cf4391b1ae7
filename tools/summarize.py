"""summarize_profile: turn a stored profile, or pasted profiler output, into ranked recommendations."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kforge.profilers.analyst import Analysis, load_provider, parse_profile_text
from kforge.profilers.report import ProfileReport

from .context import RequestError, ToolContext

__all__ = ["ProfileSummary", "summarize_profile"]


class ProfileSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    profile_id: str | None = Field(default=None, description="The stored profile that was analysed, if any.")
    source: str = Field(description="'stored profile' or the profiler recognized in the pasted text.")
    analysis: Analysis

    def __str__(self) -> str:
        head = f"Profile {self.profile_id}" if self.profile_id else f"Pasted {self.source} output"
        return f"{head}, analysed by the '{self.analysis.provider}' analyst:\n{self.analysis}"


def _stored_report(ctx: ToolContext, profile_id: str) -> ProfileReport:
    stored = ctx.store.get_profile(profile_id)
    if stored is None:
        known = ", ".join(p["profile_id"] for p in ctx.store.list_profiles(5)) or "none yet"
        raise RequestError(f"no stored profile {profile_id!r}; recent profiles: {known}. "
                           "Run profile_kernel to make one, or pass profile_text.")
    if stored.get("report") is None:
        raise RequestError(f"profile {profile_id!r} has no measurements (its run failed); profile again.")
    return ProfileReport(**stored["report"])


def summarize_profile(ctx: ToolContext, *, profile_id: str | None = None, profile_text: str | None = None,
                      code: str | None = None, previous_profile_id: str | None = None,
                      provider: str = "rules") -> ProfileSummary:
    if (profile_id is None) == (profile_text is None):
        raise RequestError("pass exactly one of profile_id (from profile_kernel) or profile_text (pasted profiler output)")
    previous = _stored_report(ctx, previous_profile_id) if previous_profile_id else None
    if profile_id is not None:
        report, source = _stored_report(ctx, profile_id), "stored profile"
    else:
        report = parse_profile_text(profile_text or "")
        if report is None:
            raise RequestError("the pasted text is not a profiler output KForge recognizes: paste a torch.profiler "
                               "key_averages().table(), or Nsight Compute details (text or --csv --page details)")
        source = report.collector
    try:
        analyst = load_provider(provider)
    except KeyError as exc:
        raise RequestError(str(exc.args[0])) from None
    analysis = analyst.analyze(report, text=profile_text, code=code, previous=previous)
    return ProfileSummary(profile_id=profile_id, source=source, analysis=analysis)
