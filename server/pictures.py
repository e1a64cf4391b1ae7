"""Profile charts as MCP image content, each also kept as an artifact of its profile.

The charts are drawn from the stored result (`kforge.profilers.charts`), after the measurement: a
profile's numbers never depend on them, and a profile served again (get_job, use_store) gets the same
pictures. They are written once to the profile's artifact directory, so
`kforge://profiles/{profile_id}/artifacts/{name}.png` serves them later.
"""

from __future__ import annotations

import base64

from mcp.types import ImageContent

from kforge.profilers.charts import PROFILE_CHARTS, Chart, before_after_chart, keep, profile_charts
from kforge.profilers.report import ProfileReport
from kforge.tools.models import ProfileResult
from kforge.tools.store import ResultStore

__all__ = ["artifact_uris", "comparison_picture", "profile_pictures"]


def artifact_uris(store: ResultStore, profile_id: str) -> list[str]:
    return [f"kforge://profiles/{profile_id}/artifacts/{n}" for n in store.artifact_names(profile_id)]


def _png_image(png: bytes) -> ImageContent:
    return ImageContent(type="image", data=base64.b64encode(png).decode(), mime_type="image/png")


def _image(chart: Chart) -> ImageContent:
    return _png_image(chart.png)


def _keep(store: ResultStore, profile_id: str, chart: Chart) -> None:
    keep(chart, store.artifact_dir(profile_id))


def profile_pictures(store: ResultStore, result: ProfileResult) -> tuple[ProfileResult, list[ImageContent]]:
    """`result` listing its chart artifacts, and the charts as images (none for a failed profile). profile_kernel
    draws them beside its last steps (`kforge.tools.profile`); a profile stored without them is drawn here."""
    if not result.ok or result.report is None or result.profile_id is None:
        return result, []
    where = store.artifact_dir(result.profile_id)
    pngs = [(where / name).read_bytes() for name in PROFILE_CHARTS if (where / name).exists()]
    if not pngs:
        charts = profile_charts(result.report)
        for chart in charts:
            _keep(store, result.profile_id, chart)
        pngs = [c.png for c in charts]
    listed = result.model_copy(update={"artifacts": artifact_uris(store, result.profile_id)})
    return listed, [_png_image(png) for png in pngs]


def _report(store: ResultStore, profile_id: str) -> ProfileReport | None:
    stored = store.get_profile(profile_id)
    return ProfileReport(**stored["report"]) if stored and stored.get("report") else None


def comparison_picture(store: ResultStore, previous_id: str, profile_id: str) -> ImageContent | None:
    """The before/after chart of two stored profiles, kept with the later one; None when either lacks timings."""
    before, after = _report(store, previous_id), _report(store, profile_id)
    if before is None or after is None:
        return None
    chart = before_after_chart(before, after, before_id=previous_id, after_id=profile_id)
    if chart is None:
        return None
    _keep(store, profile_id, chart)
    return _image(chart)
