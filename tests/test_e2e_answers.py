"""End to end over stdio (the MCP SDK's client and a real `kforge serve`): charts as images and artifacts,
the compact JSON copy, consequences shown as such, and cancel_job's answer."""

from __future__ import annotations

import base64
import io
import json
import uuid

import anyio
import pytest
from PIL import Image

from .conftest import stdio_session

pytestmark = pytest.mark.anyio


def data(result) -> dict:
    assert not result.is_error, result.content[0].text
    return result.structured_content


def pictures(result) -> list[tuple[bytes, dict]]:
    """Each image block's PNG bytes and the numbers it says it plots."""
    out = []
    for block in result.content:
        if block.type == "image":
            assert block.mime_type == "image/png"
            png = base64.b64decode(block.data)
            image = Image.open(io.BytesIO(png))
            assert image.format == "PNG" and image.size[0] >= 400
            out.append((png, json.loads(image.info["Description"])))
    return out


def medians(profile: dict) -> dict[str, float]:
    report = profile["report"]
    return {"candidate": report["candidate"]["median_us"], **{b["name"]: b["timing"]["median_us"] for b in report["baselines"]}}


async def test_profile_and_summary_charts(kforge_home, cpu_example):
    args = {"backend": "cpu", "reference_code": cpu_example["reference"], "candidate_code": cpu_example["candidate"],
            "budget_s": 0.3}
    async with stdio_session(kforge_home) as client:
        first = await client.call_tool("profile_kernel", args)
        prof = data(first)
        assert [b.type for b in first.content] == ["text", "image", "image", "text"]
        (timing_png, timing), (_, roofline) = pictures(first)
        assert timing["kind"] == "timings" and timing["median_us"] == medians(prof)
        assert {n: v["ci"] for n, v in timing["speedup"].items()} == {
            b["name"]: b["speedup_ci"] for b in prof["report"]["baselines"]}
        assert roofline["peak_bandwidth_gbs"] == prof["report"]["device"]["peak_bandwidth_gbs"]
        assert roofline["achieved_gbs"]["candidate"] == pytest.approx(prof["report"]["achieved_bandwidth_gbs"], rel=1e-3)

        # the charts are the profile's artifacts, served as images
        uri = f"kforge://profiles/{prof['profile_id']}/artifacts/timings.png"
        assert uri in prof["artifacts"]
        served = (await client.read_resource(uri)).contents[0]
        assert served.mime_type == "image/png" and base64.b64decode(served.blob) == timing_png
        stored = json.loads((await client.read_resource(f"kforge://profiles/{prof['profile_id']}")).contents[0].text)
        assert uri in stored["artifacts"]

        second = data(await client.call_tool("profile_kernel", args))
        summary = await client.call_tool("summarize_profile", {"profile_id": second["profile_id"],
                                                               "previous_profile_id": prof["profile_id"]})
        data(summary)
        ((_, change),) = pictures(summary)
        assert change["kind"] == "before_after" and change["before"] == prof["profile_id"]
        assert change["median_us"]["candidate"] == {"before": medians(prof)["candidate"],
                                                    "after": medians(second)["candidate"]}
        assert f"previous_profile_id='{second['profile_id']}'" in summary.content[0].text  # its next step


async def test_a_wrong_verdict_reads_short_and_names_its_finding(kforge_home, cpu_example, candidate):
    async with stdio_session(kforge_home) as client:
        answer = await client.call_tool("verify_against_reference", {
            "backend": "cpu", "reference_code": cpu_example["reference"], "candidate_code": candidate("wrong_forgets_bias"),
            "use_store": False})
    verdict = data(answer)
    text, copy = answer.content[0].text, answer.content[-1].text
    assert not verdict["correct"] and json.loads(copy)["correct"] is False
    assert len(copy) <= len(json.dumps(verdict, separators=(",", ":"))) / 2
    assert "[fail] outputs_match" in text and "[fail] deterministic" not in text
    assert "consequence of the wrong output" in text and "reduced-precision" not in text
    assert text.splitlines()[-1].startswith("Next: fix the output")


async def test_cancel_job_says_cancelled(kforge_home, candidate):
    code = candidate("slow_import") + f"\n# {uuid.uuid4().hex}\n"  # unique: no stored answer, no running twin
    async with stdio_session(kforge_home) as client:
        handle = data(await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": code, "wait_s": 0}))
        with anyio.fail_after(60):
            while data(await client.call_tool("get_job", {"job_id": handle["job_id"], "wait_s": 0}))["status"] == "queued":
                await anyio.sleep(0.2)
        answer = await client.call_tool("cancel_job", {"job_id": handle["job_id"]})
    assert data(answer)["status"] == "cancelled"
    assert "cancelled" in answer.content[0].text and "is running" not in answer.content[0].text
