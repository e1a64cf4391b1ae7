"""Charts of a profile, for people who would rather look than read: PNG bytes from `ProfileReport`s.

- `timing_chart`: the candidate's and each baseline's median time with its IQR, and the candidate's
  speedup over each baseline with its ~95% interval (a line at 1: no difference).
- `roofline_chart`: the candidate (and the baselines) against the device's measured ceilings: FLOP/s over
  arithmetic intensity where the problem's FLOPs are counted, else bandwidth against the measured copy
  bandwidth (torch's flop counter counts matmuls and convolutions only).
- `before_after_chart`: two profiles of one problem side by side.

Each chart carries the numbers it plots (`Chart.data`), also written into the PNG as its "Description"
text chunk, so a reader (or a test) can check the picture against the result it came from.
Drawing uses matplotlib's object API on the Agg canvas: no pyplot, no global backend, safe in threads.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from .report import ProfileReport, TimingStats

__all__ = ["PROFILE_CHARTS", "Chart", "before_after_chart", "keep", "profile_charts", "roofline_chart", "timing_chart"]

_SIZE_IN = (8.0, 3.4)  # small: every image costs the reading model context
_DPI = 100
_CANDIDATE_COLOR, _BASELINE_COLOR, _CEILING_COLOR = "#d62728", "#1f77b4", "#555555"


class Chart(BaseModel):
    """One PNG and the numbers it shows."""

    model_config = ConfigDict(frozen=True)

    name: str  # its artifact file name
    title: str
    data: dict[str, Any]
    png: bytes


PROFILE_CHARTS = ("timings.png", "roofline.png")  # the file names of what `profile_charts` draws, in its order


def keep(chart: Chart, directory: Path) -> None:
    """Write `chart` into `directory` (a profile's artifacts) unless it is there: drawn from the same stored
    numbers, the file already there is the same picture."""
    path = directory / chart.name
    if not path.exists():
        path.write_bytes(chart.png)


def profile_charts(report: ProfileReport) -> list[Chart]:
    """The charts `profile_kernel` returns: timings, and the roofline where the device's ceilings are known."""
    return [c for c in (timing_chart(report), roofline_chart(report)) if c is not None]


def _series(report: ProfileReport) -> dict[str, TimingStats]:
    timed = {"candidate": report.candidate} if report.candidate is not None else {}
    return {**timed, **{b.name: b.timing for b in report.baselines if b.timing is not None}}


def _below(s: TimingStats) -> float:
    """The IQR's extent below the median (never negative: matplotlib refuses negative error bars)."""
    return max(0.0, s.median_us - s.q1_us)


def _above(s: TimingStats) -> float:
    return max(0.0, s.q3_us - s.median_us)


def _unit(values_us: list[float]) -> tuple[str, float]:
    """Display unit for times in microseconds (stored in us; shown as format_us would)."""
    top = max(values_us, default=0.0)
    return ("s", 1e6) if top >= 1e6 else ("ms", 1e3) if top >= 1e3 else ("us", 1.0)


def timing_chart(report: ProfileReport) -> Chart | None:
    series = _series(report)
    if "candidate" not in series:
        return None
    speedups = {b.name: {"speedup": b.speedup, "ci": list(b.speedup_ci)} for b in report.baselines
                if b.speedup is not None and b.speedup_ci is not None}
    data = {"kind": "timings", "median_us": {n: s.median_us for n, s in series.items()},
            "iqr_us": {n: [s.q1_us, s.q3_us] for n, s in series.items()}, "speedup": speedups}
    fig, (times, ratios) = _figure(ncols=2, width_ratios=(3, 2))
    unit, scale = _unit([s.q3_us for s in series.values()])
    names = list(series)[::-1]  # candidate on top
    for y, name in enumerate(names):
        s = series[name]
        color = _CANDIDATE_COLOR if name == "candidate" else _BASELINE_COLOR
        times.errorbar(s.median_us / scale, y, xerr=[[_below(s) / scale], [_above(s) / scale]],
                       fmt="o", color=color, capsize=4)
        times.annotate(f"{s.median_us / scale:.3g} {unit}", (s.median_us / scale, y), textcoords="offset points",
                       xytext=(0, 7), ha="center", fontsize=8)
    times.set_yticks(range(len(names)), names)
    times.set_xlabel(f"time per call ({unit}): median, IQR")
    times.set_xlim(left=0)
    times.set_ylim(-0.6, len(names) - 0.4)
    if speedups:
        labels = list(speedups)[::-1]
        for y, name in enumerate(labels):
            sp, (lo, hi) = speedups[name]["speedup"], speedups[name]["ci"]
            ratios.errorbar(sp, y, xerr=[[max(0.0, sp - lo)], [max(0.0, hi - sp)]], fmt="s", color=_CANDIDATE_COLOR, capsize=4)
            ratios.annotate(f"x{sp:.2f}", (sp, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
        ratios.axvline(1.0, color=_CEILING_COLOR, linestyle="--", linewidth=1)
        ratios.set_yticks(range(len(labels)), [f"vs {n}" for n in labels])
        ratios.set_ylim(-0.6, len(labels) - 0.4)
        ratios.set_xlabel("speedup, ~95% interval (>1: faster)")
    else:
        ratios.set_axis_off()
        ratios.text(0.5, 0.5, "no baseline timed", ha="center", va="center", transform=ratios.transAxes)
    title = f"{report.device_name}: candidate vs baselines"
    return _finish(fig, "timings.png", title, data)


def _peak_tflops(report: ProfileReport) -> float | None:
    """The FLOP/s ceiling the report's compute_fraction was read against (float32's when it has none)."""
    if report.achieved_tflops and report.compute_fraction:
        return report.achieved_tflops / report.compute_fraction
    peaks = report.device.peak_tflops if report.device else {}
    return peaks.get("float32") or max(peaks.values(), default=None)


def roofline_chart(report: ProfileReport) -> Chart | None:
    device, series = report.device, _series(report)
    if device is None or not device.peak_bandwidth_gbs or not report.problem_bytes or "candidate" not in series:
        return None
    gbs = {n: report.problem_bytes / s.median_us / 1e3 for n, s in series.items() if s.median_us > 0}
    peak_tflops = _peak_tflops(report)
    if report.problem_flops and peak_tflops:
        return _flops_roofline(report, series, device.peak_bandwidth_gbs, peak_tflops)
    data = {"kind": "bandwidth", "peak_bandwidth_gbs": device.peak_bandwidth_gbs, "achieved_gbs": gbs,
            "problem_bytes": report.problem_bytes}
    fig, (ax,) = _figure(ncols=1)
    names = list(gbs)[::-1]
    ax.barh(range(len(names)), [gbs[n] for n in names],
            color=[_CANDIDATE_COLOR if n == "candidate" else _BASELINE_COLOR for n in names])
    for y, n in enumerate(names):
        ax.annotate(f"{gbs[n]:.3g} GB/s ({100 * gbs[n] / device.peak_bandwidth_gbs:.0f}%)", (gbs[n], y),
                    textcoords="offset points", xytext=(4, -3), fontsize=8)
    ax.axvline(device.peak_bandwidth_gbs, color=_CEILING_COLOR, linestyle="--", linewidth=1.5,
               label=f"measured ceiling {device.peak_bandwidth_gbs:.3g} GB/s")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlim(0, 1.3 * max(device.peak_bandwidth_gbs, *gbs.values()))
    ax.set_xlabel("problem bytes (inputs + outputs) / median time, GB/s")
    title = (f"{report.device_name}: memory roofline (no FLOP count: torch counts matmuls and convolutions only)")
    return _finish(fig, "roofline.png", title, data)


def _flops_roofline(report: ProfileReport, series: dict[str, TimingStats], peak_gbs: float, peak_tflops: float) -> Chart:
    intensity = report.problem_flops / report.problem_bytes  # FLOP per byte, the same for every series
    tflops = {n: report.problem_flops / s.median_us / 1e6 for n, s in series.items() if s.median_us > 0}
    ridge = peak_tflops * 1e3 / peak_gbs  # FLOP/byte where the bandwidth roof meets the compute roof
    data = {"kind": "roofline", "peak_bandwidth_gbs": peak_gbs, "peak_tflops": peak_tflops, "intensity": intensity,
            "ridge_intensity": ridge, "achieved_tflops": tflops}
    fig, (ax,) = _figure(ncols=1)
    lo, hi = min(intensity, ridge) / 20, max(intensity, ridge) * 20
    xs = [lo * (hi / lo) ** (i / 63) for i in range(64)]
    ax.plot(xs, [min(peak_gbs * x / 1e3, peak_tflops) for x in xs], color=_CEILING_COLOR, linewidth=2,
            label=f"measured ceilings: {peak_gbs:.3g} GB/s, {peak_tflops:.3g} TFLOP/s")
    for name, value in tflops.items():
        own = name == "candidate"
        ax.plot([intensity], [value], "o" if own else "^", color=_CANDIDATE_COLOR if own else _BASELINE_COLOR,
                markersize=9 if own else 7, label=f"{name}: {value:.3g} TFLOP/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / problem byte)")
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=8, loc="lower right")
    return _finish(fig, "roofline.png", f"{report.device_name}: roofline", data)


def before_after_chart(before: ProfileReport, after: ProfileReport, *, before_id: str, after_id: str) -> Chart | None:
    """Each series timed in both profiles: median and IQR before and after."""
    old, new = _series(before), _series(after)
    names = [n for n in new if n in old]
    if "candidate" not in names:
        return None
    data = {"kind": "before_after", "before": before_id, "after": after_id,
            "median_us": {n: {"before": old[n].median_us, "after": new[n].median_us} for n in names}}
    fig, (ax,) = _figure(ncols=1)
    unit, scale = _unit([s.q3_us for s in (*old.values(), *new.values())])
    rows = names[::-1]
    for offset, label, stats, color in ((0.18, f"before ({before_id})", old, "#9e9e9e"),
                                        (-0.18, f"after ({after_id})", new, _CANDIDATE_COLOR)):
        ys = [y + offset for y in range(len(rows))]
        ax.barh(ys, [stats[n].median_us / scale for n in rows], height=0.34, color=color, label=label,
                xerr=[[_below(stats[n]) / scale for n in rows], [_above(stats[n]) / scale for n in rows]], capsize=3)
    change = new["candidate"].median_us / old["candidate"].median_us
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(f"time per call ({unit}): median, IQR")
    ax.legend(fontsize=8, loc="lower right")
    title = (f"{after.device_name}: candidate {old['candidate'].median_us / scale:.3g} -> "
             f"{new['candidate'].median_us / scale:.3g} {unit} (x{1 / change:.2f} faster)" if change < 1 else
             f"{after.device_name}: candidate {old['candidate'].median_us / scale:.3g} -> "
             f"{new['candidate'].median_us / scale:.3g} {unit} (x{change:.2f} slower)")
    return _finish(fig, f"vs-{before_id}.png", title, data)


def _figure(*, ncols: int, width_ratios: tuple[float, ...] | None = None) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure  # imported on first use: a second of start-up a server rarely needs

    # Fixed margins, wide enough for the longest tick label ("vs torch.compile") and axis label: constrained
    # layout measured every text again and took a quarter of the drawing, which a profile's answer waits for.
    fig = Figure(figsize=_SIZE_IN, dpi=_DPI)
    fig.subplots_adjust(left=0.15, right=0.96, bottom=0.16, top=0.86, wspace=0.6)
    axes = fig.subplots(1, ncols, width_ratios=width_ratios) if ncols > 1 else [fig.subplots()]
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return fig, list(axes)


def _finish(fig: Any, name: str, title: str, data: dict[str, Any]) -> Chart:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.suptitle(title, fontsize=10)
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf, metadata={"Title": title, "Description": json.dumps(data),
                                                  "Software": "kforge (matplotlib)"})
    return Chart(name=name, title=title, data=data, png=buf.getvalue())
