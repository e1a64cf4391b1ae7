"""Answers an agent acts on: summaries that are true and name one next step that works here, the compact JSON
copy of a result, the charts, and prompt errors that name the argument. Results are real runs (tests/data/results)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from mcp import Client, MCPError

from kforge.profilers.charts import before_after_chart, profile_charts, roofline_chart, timing_chart
from kforge.server.app import build_server
from kforge.server.compact import compact_copy
from kforge.server.settings import Settings
from kforge.tools.jobs import JobStatus
from kforge.tools.models import (Check, CompileResult, Failure, ProfileResult, VerifyResult, plausible_hints,
                                 split_consequences)

RESULTS = Path(__file__).parent / "data" / "results"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def result(name: str, model):
    return model(**json.loads((RESULTS / f"{name}.json").read_text()))


def nexts(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("Next:")]


def walk(value):
    yield value
    if isinstance(value, dict):
        for v in value.values():
            yield from walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk(v)


# -- the compact JSON copy ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["verify_correct", "verify_wrong"])
def test_the_json_copy_of_a_verify_is_at_most_half_the_full_one(name):
    verdict = result(name, VerifyResult)
    full = json.dumps(verdict.model_dump(mode="json", exclude_none=True), separators=(",", ":"))
    copy = compact_copy(verdict)
    assert len(json.dumps(copy, separators=(",", ":"))) <= len(full) / 2
    assert all(v is not None for v in walk(copy))
    assert "spec" in copy and "spec" not in copy["compile"]                     # the spec once
    passed = {c.name for c in verdict.checks if c.status == "pass"}
    assert set(copy["checks_passed"]) == passed
    assert {c["name"] for c in copy.get("checks", [])} == {c.name for c in verdict.checks} - passed
    for trial, kept in zip(verdict.trials, copy["trials"]):
        assert kept["trial"] == trial.trial and kept["seed"] == trial.seed
        for out, out_kept in zip(trial.outputs, kept["outputs"]):
            if out.correct:                                                    # detail only where it failed
                assert set(out_kept) <= {"output", "max_abs_error", "rel_error"}
            else:
                assert out_kept["mismatches"] == out.mismatches
                assert out_kept["rel_error"] == pytest.approx(out.rel_error, rel=1e-3)


def test_a_repeated_failure_points_at_the_first_instead_of_repeating_it():
    copy = compact_copy(result("verify_wrong", VerifyResult))
    first, *later = [t["outputs"][0] for t in copy["trials"]]
    assert first["problems"] and first["expected"]["shape"] == [512, 2048] and len(first["first_mismatches"]) == 3
    assert all(o["same_as_trial"] == 0 and "problems" not in o for o in later)
    assert all(o["first_mismatches"] for o in later)                          # its own numbers stay


# -- summaries ----------------------------------------------------------------------------------------
def test_a_wrong_candidate_shows_one_finding_and_its_consequences():
    text = str(result("verify_wrong", VerifyResult))
    assert text.startswith("WRONG: 0/5 trials passed")
    assert "[fail] outputs_match" in text
    assert "[fail] deterministic" not in text and "[fail] probe_memo" not in text
    assert re.search(r"as a consequence of the wrong output.*: deterministic, probe_memo", text)
    assert "reduced-precision arithmetic" not in text                          # 0.807 is no rounding error
    assert text.count("elements differ beyond") == 1                            # said once, not per trial
    assert nexts(text) == [text.splitlines()[-1]] and "verify_against_reference again" in text.splitlines()[-1]


def test_a_rerun_that_fails_where_the_trial_passed_is_a_finding():
    checks = [Check(name="outputs_match", status="fail", hard=True, evidence="1/5 trials wrong"),
              Check(name="deterministic", status="fail", hard=True, evidence="wrong result in trial(s) [0, 3]: ...")]
    findings, consequences = split_consequences(checks, wrong_trials={0})
    assert [c.name for c in findings] == ["outputs_match", "deterministic"] and consequences == []
    findings, consequences = split_consequences(checks, wrong_trials={0, 3})
    assert [c.name for c in consequences] == ["deterministic"]


def test_the_precision_hint_stays_where_reduced_precision_could_explain_the_error():
    hint = " (reduced-precision arithmetic? declare it with precision='tf32'/'fp16'/'bf16')"
    small = f"relative L2 error 0.00312 exceeds the bound 1e-05 for float32 at precision=strict{hint}"
    large = f"relative L2 error 0.661 exceeds the bound 1e-05 for float32 at precision=strict{hint}"
    assert plausible_hints(small) == small
    assert plausible_hints(large) == large.removesuffix(hint)


def test_no_profile_step_where_the_host_cannot_time_the_backend():
    verdict = result("verify_correct", VerifyResult)
    assert nexts(str(verdict)) == ["Next: profile_kernel to time it against eager and torch.compile."]
    here = verdict.summary(timing_here=False, why_not_timed="no GPU: results are verified, not timed")
    (step,) = nexts(here)
    assert "nothing more on this host" in step and "no GPU" in step and not step.startswith("Next: profile_kernel")


def test_every_summary_names_one_next_step():
    spec = result("verify_correct", VerifyResult).spec
    build = Failure(stage="build", kind="build_error", message="'x' was not declared", line=8)
    crash = Failure(stage="forward", kind="crashed", message="SIGSEGV")
    answers = [
        result("verify_correct", VerifyResult), result("verify_wrong", VerifyResult), result("profile_cpu", ProfileResult),
        CompileResult(spec=spec, ok=True, build_seconds=1, load_seconds=1, from_cache=True),
        CompileResult(spec=spec, ok=False, build_seconds=1, load_seconds=1, from_cache=False, failure=build),
        VerifyResult(spec=spec, ok=False, correct=False, failure=crash),
        ProfileResult(spec=spec, ok=False, failure=build),
        *[JobStatus(status=s, job_id="j1", tool="verify_against_reference", retry_after_s=3, message="m")
          for s in ("queued", "running", "cancelling", "cancelled", "busy")],
    ]
    for answer in answers:
        assert len(nexts(str(answer))) == 1, str(answer)
    assert "fix line 8, then call compile_kernel again" in str(answers[4])
    assert "cancelled" in str(answers[-2]) and "is running" not in str(answers[-2])


def test_a_noisy_profile_asks_for_a_quieter_run():
    profile = result("profile_cpu", ProfileResult)
    assert [c.name for c in profile.checks if c.status == "fail"] == ["stable_timing"]
    assert nexts(str(profile)) == ["Next: profile_kernel again with budget_s=1 on an idle machine: these speedups "
                                   "are too noisy to quote."]


# -- charts -------------------------------------------------------------------------------------------
def png_data(png: bytes) -> tuple[tuple[int, int], dict]:
    """The picture's size and the numbers it says it plots (its Description text chunk)."""
    assert png.startswith(PNG_MAGIC)
    image = Image.open(io.BytesIO(png))
    image.load()
    colors = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colors is None or len(colors) > 20, "a blank picture"
    return image.size, json.loads(image.info["Description"])


def test_the_timing_chart_plots_the_profiles_medians_and_intervals():
    report = result("profile_cpu", ProfileResult).report
    chart = timing_chart(report)
    size, data = png_data(chart.png)
    assert size == (800, 340) and data == chart.data
    assert data["median_us"] == {"candidate": report.candidate.median_us,
                                 **{b.name: b.timing.median_us for b in report.baselines}}
    assert data["iqr_us"]["candidate"] == [report.candidate.q1_us, report.candidate.q3_us]
    assert {n: v["ci"] for n, v in data["speedup"].items()} == {b.name: list(b.speedup_ci) for b in report.baselines}


def test_the_roofline_reads_against_the_measured_ceilings():
    report = result("profile_cpu", ProfileResult).report
    chart = roofline_chart(report)  # a ReLU: no FLOPs counted, so bandwidth against the copy ceiling
    _, data = png_data(chart.png)
    assert data["kind"] == "bandwidth" and data["peak_bandwidth_gbs"] == report.device.peak_bandwidth_gbs
    assert data["achieved_gbs"]["candidate"] == pytest.approx(report.achieved_bandwidth_gbs, rel=1e-3)
    flops = 2 * 512 * 2048 * 2048
    matmul = report.model_copy(update={"problem_flops": flops, "achieved_tflops": flops / report.candidate.median_us / 1e6,
                                       "compute_fraction": 0.25})
    _, data = png_data(roofline_chart(matmul).png)
    assert data["kind"] == "roofline" and data["intensity"] == flops / report.problem_bytes
    assert data["peak_tflops"] == pytest.approx(matmul.achieved_tflops / 0.25)
    assert [c.name for c in profile_charts(report)] == ["timings.png", "roofline.png"]


def test_the_before_after_chart_compares_the_same_series():
    before = result("profile_cpu", ProfileResult).report
    c = before.candidate
    faster = c.model_copy(update={"median_us": c.median_us / 2, "q1_us": c.q1_us / 2, "q3_us": c.q3_us / 2})
    after = before.model_copy(update={"candidate": faster})
    chart = before_after_chart(before, after, before_id="old", after_id="new")
    _, data = png_data(chart.png)
    assert chart.name == "vs-old.png" and "x2.00 faster" in chart.title
    assert data["median_us"]["candidate"] == {"before": before.candidate.median_us, "after": faster.median_us}


# -- prompts ------------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_prompt_errors_name_the_argument(tmp_path):
    async with Client(build_server(Settings(home=tmp_path))) as client:
        with pytest.raises(MCPError) as missing:
            await client.get_prompt("optimization_pass", {"backend": "cpu"})
        with pytest.raises(MCPError) as bad:
            await client.get_prompt("functional_pass", {"backend": "metal", "problem": "relu"})
    assert "problem, candidate_code" in missing.value.error.message and "Internal" not in missing.value.error.message
    assert "argument backend" in bad.value.error.message and "'metal'" in bad.value.error.message
