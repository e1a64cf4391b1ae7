"""summarize_profile: a stored profile, pasted profiler output or screenshots -> ranked recommendations.

The built-in rules always run first (offline, deterministic). A configured model analyst (an HTTP
API, or the client's own model through MCP sampling) then gets the rules' findings with the metrics,
text and screenshots; when it cannot be reached or answers badly, the rules' analysis is returned with
a note saying so. `prepare_summary` is deterministic for the same inputs, which MCP sampling needs:
the server builds the sampling request from it before the tool body runs.
"""

from __future__ import annotations

import base64
import binascii
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kforge.profilers.analyst import Analysis, load_provider, parse_profile_text
from kforge.profilers.analyst.http import ModelConfig, ModelError, ask_model
from kforge.profilers.analyst.model import AnalystRequest, Image, analyst_request, fallback, parse_answer
from kforge.profilers.compiler_report import CANDIDATE_ARTIFACT, CompilerFacts, CompilerReport, KernelResources
from kforge.profilers.report import ProfileReport

from .context import ToolContext

from .tool_inputs import RequestError

__all__ = ["AnalystConfig", "Prepared", "ProfileSummary", "finish_summary", "prepare_summary", "summarize_profile"]

MAX_SCREENSHOTS = 8
MAX_SCREENSHOT_BYTES = 8 * 2**20
_MAGIC = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg"}
_OCR_TIMEOUT_S = 60
CONFIGURE_VISION = (
    "screenshots need a vision-capable analyst: set KFORGE_ANALYST=anthropic (with ANTHROPIC_API_KEY and "
    "KFORGE_ANALYST_MODEL), or KFORGE_ANALYST=openai (OPENAI_API_KEY, or KFORGE_ANALYST_BASE_URL for a local "
    "vLLM/Ollama/llama.cpp server running a vision model), or KFORGE_ANALYST=sampling with a client that offers "
    "sampling; install tesseract to read them by OCR; or paste the profiler's text export instead "
    "(ncu --page details, torch.profiler's table)")

Provider = Literal["rules", "anthropic", "openai", "sampling"]


@dataclass(frozen=True)
class AnalystConfig:
    """Which analyst answers (server configuration; see server/settings.py)."""

    provider: Provider = "rules"
    model: ModelConfig | None = None  # for 'anthropic' and 'openai'

    @property
    def sees_images(self) -> bool:
        if self.provider == "sampling":
            return True  # the client's model decides; a client that cannot see images says so
        return self.model is not None and self.model.vision


class ProfileSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    profile_id: str | None = Field(default=None, description="The stored profile that was analysed, if any.")
    source: str = Field(description="'stored profile', the profiler recognized in the pasted text, or 'screenshots'.")
    analysis: Analysis

    def __str__(self) -> str:
        head = f"Profile {self.profile_id}" if self.profile_id else f"Pasted {self.source}"
        return f"{head}, analysed by the '{self.analysis.provider}' analyst:\n{self.analysis}\n{self._next_step()}"

    def _next_step(self) -> str:
        first = self.analysis.recommendations[0].title if self.analysis.recommendations else "the change above"
        if self.profile_id is None:  # pasted output: nothing of KForge's to compare against yet
            return (f"Next: make change 1 ({first}), verify_against_reference, then profile_kernel it here to "
                    "measure the effect.")
        return (f"Next: make change 1 ({first}), verify_against_reference, then profile_kernel and summarize_profile "
                f"with previous_profile_id='{self.profile_id}' to see the before/after.")


@dataclass(frozen=True)
class Prepared:
    """Everything an analyst reads, gathered once: the report, the rules' analysis, and what a model gets."""

    profile_id: str | None
    source: str
    report: ProfileReport | None
    text: str | None
    rules: Analysis | None
    code: str | None = None
    previous: ProfileReport | None = None
    images: tuple[Image, ...] = ()
    notes: tuple[str, ...] = ()
    compiler: CompilerFacts | None = None

    def request(self) -> AnalystRequest:
        """A model analyst's request, rendered only for one (the rules need none)."""
        return analyst_request(self.report, self.rules, text=self.text, code=self.code, previous=self.previous,
                               images=self.images, compiler=self.compiler)


def _stored_report(ctx: ToolContext, profile_id: str) -> ProfileReport:
    return ProfileReport(**_stored(ctx, profile_id)["report"])


def _stored(ctx: ToolContext, profile_id: str) -> dict:
    stored = ctx.store.get_profile(profile_id)
    if stored is None:
        known = ", ".join(p["profile_id"] for p in ctx.store.list_profiles(5)) or "none yet"
        raise RequestError(f"no stored profile {profile_id!r}; recent profiles: {known}. "
                           "Run profile_kernel to make one, or pass profile_text.")
    if stored.get("report") is None:
        raise RequestError(f"profile {profile_id!r} has no measurements (its run failed); profile again.")
    return stored


def _stored_compiler(stored: dict) -> CompilerFacts:
    """What the compilers reported when the profiled candidate was built."""
    return CompilerFacts(builds=[CompilerReport(**b) for b in stored.get("compiler_reports") or []],
                         kernels=[KernelResources(**k) for k in stored.get("kernel_resources") or []])


def _stored_code(ctx: ToolContext, profile_id: str) -> str | None:
    path = ctx.store.artifact_path(profile_id, CANDIDATE_ARTIFACT)
    try:
        return path.read_text() if path is not None else None
    except OSError:
        return None


def decode_screenshots(screenshots: list[str]) -> tuple[Image, ...]:
    """Base64 PNG/JPEG (a data: URL prefix is allowed) -> Images; RequestError names the bad one."""
    if len(screenshots) > MAX_SCREENSHOTS:
        raise RequestError(f"{len(screenshots)} screenshots; at most {MAX_SCREENSHOTS} per call")
    images = []
    for i, item in enumerate(screenshots, start=1):
        data = item.split(",", 1)[1] if item.startswith("data:") else item
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(f"screenshot {i} is not valid base64") from None
        if len(raw) > MAX_SCREENSHOT_BYTES:
            raise RequestError(f"screenshot {i} is {len(raw) / 2**20:.1f} MiB; at most {MAX_SCREENSHOT_BYTES // 2**20} MiB")
        mime = next((m for magic, m in _MAGIC.items() if raw.startswith(magic)), None)
        if mime is None:
            raise RequestError(f"screenshot {i} is neither PNG nor JPEG")
        images.append(Image(mime_type=mime, data=base64.b64encode(raw).decode()))
    return tuple(images)


def ocr_text(images: tuple[Image, ...]) -> str | None:
    """The screenshots' text by tesseract, where it is installed; None otherwise."""
    tesseract = shutil.which("tesseract")
    if tesseract is None or not images:
        return None
    texts = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, image in enumerate(images):
            path = Path(tmp) / f"shot{i}.{image.mime_type.split('/')[1]}"
            path.write_bytes(base64.b64decode(image.data))
            # --psm 6: a uniform block of text keeps table rows on their lines
            out = subprocess.run([tesseract, str(path), "stdout", "--psm", "6"], capture_output=True, text=True,
                                 timeout=_OCR_TIMEOUT_S)
            if out.returncode == 0:
                texts.append(out.stdout)
    return "\n".join(texts) or None


def prepare_summary(ctx: ToolContext, analyst: AnalystConfig, *, profile_id: str | None = None,
                    profile_text: str | None = None, screenshots: list[str] | None = None, code: str | None = None,
                    previous_profile_id: str | None = None) -> Prepared:
    if profile_id is not None and profile_text is not None:
        raise RequestError("pass profile_id (from profile_kernel) or profile_text (pasted profiler output), not both")
    if profile_id is None and profile_text is None and not screenshots:
        raise RequestError("pass one of: profile_id (from profile_kernel), profile_text (pasted profiler output), "
                           "or screenshots (base64 PNG/JPEG of profiler windows)")
    images = decode_screenshots(screenshots or [])
    previous = _stored_report(ctx, previous_profile_id) if previous_profile_id else None
    notes: list[str] = []
    text = profile_text
    if images and not analyst.sees_images:
        ocr = ocr_text(images)
        if ocr is not None and parse_profile_text(ocr) is not None and text is None and profile_id is None:
            text = ocr
            notes.append("read the screenshots by OCR (tesseract); check the numbers against the window")
        elif profile_id is None and text is None:
            raise RequestError(CONFIGURE_VISION)
        else:
            notes.append("the screenshots were not read: " + CONFIGURE_VISION)
        images = ()
    report, source, compiler = None, "screenshots", None
    if profile_id is not None:
        stored = _stored(ctx, profile_id)
        report, source, compiler = ProfileReport(**stored["report"]), "stored profile", _stored_compiler(stored)
        if code is None and (code := _stored_code(ctx, profile_id)) is not None:
            notes.append("read the profiled candidate's code from the profile (pass candidate_code to analyse another version)")
    elif text is not None:
        report = parse_profile_text(text)
        if report is None and not images and analyst.provider == "rules":
            raise RequestError("the pasted text is not a profiler output the built-in rules read: paste a "
                               "torch.profiler key_averages().table(), or Nsight Compute details (text or --csv "
                               "--page details); for other profilers (VTune, Instruments, Nsight Systems) "
                               "configure a model analyst (KFORGE_ANALYST)")
        source = report.collector if report else "text"  # a model analyst reads any profiler's text
    rules = load_provider("rules").analyze(report, text=text if profile_id is None else None, code=code,
                                           previous=previous, compiler=compiler) if report else None
    return Prepared(profile_id=profile_id, source=source, report=report, text=text, rules=rules, code=code,
                    previous=previous, images=images, notes=tuple(notes), compiler=compiler)


def finish_summary(prepared: Prepared, analysis: Analysis) -> ProfileSummary:
    if prepared.notes:
        analysis = analysis.model_copy(update={"notes": [*analysis.notes, *prepared.notes]})
    return ProfileSummary(profile_id=prepared.profile_id, source=prepared.source, analysis=analysis)


def from_reply(prepared: Prepared, provider: str, reply: str | None, failure: str | None = None) -> Analysis:
    """A model's reply as the analysis, or the rules' analysis with the reason the reply is not used."""
    if reply is None:
        return fallback(prepared.rules, provider, failure or "no answer")
    try:
        return parse_answer(reply, provider, prepared.rules, code=prepared.code, report=prepared.report)
    except ValueError as exc:
        return fallback(prepared.rules, provider, f"its answer was unusable ({exc})")


async def summarize_profile(ctx: ToolContext, *, analyst: AnalystConfig = AnalystConfig(), profile_id: str | None = None,
                            profile_text: str | None = None, screenshots: list[str] | None = None,
                            code: str | None = None, previous_profile_id: str | None = None) -> ProfileSummary:
    """Analyse with the configured provider ('sampling' is completed by the server, which owns the session)."""
    prepared = prepare_summary(ctx, analyst, profile_id=profile_id, profile_text=profile_text, screenshots=screenshots,
                               code=code, previous_profile_id=previous_profile_id)
    if analyst.provider == "rules" or analyst.model is None:
        analysis = prepared.rules or fallback(None, analyst.provider, "no model analyst is configured")
        return finish_summary(prepared, analysis)
    try:
        reply = await ask_model(analyst.model, prepared.request())
    except ModelError as exc:
        return finish_summary(prepared, from_reply(prepared, analyst.model.label, None, str(exc)))
    return finish_summary(prepared, from_reply(prepared, analyst.model.label, reply))
