"""Candidates that crash, hang, exit, raise or eat memory become results; the server keeps serving."""

from __future__ import annotations

import pytest

from .conftest import stdio_session

pytestmark = pytest.mark.anyio

# Short deadline and a tight memory cap so the hang and the memory hog end quickly.
_ENV = {"KFORGE_WORKER_TIMEOUT_S": "25", "KFORGE_WORKER_MEMORY_MB": "6144"}


@pytest.mark.parametrize("name, kind, says", [
    ("segfault", "crashed", "SIGSEGV"),
    ("hard_exit", "exited", "code 3"),
    ("endless", "timeout", "no answer within 25 s"),
    ("memory_hog", "out_of_memory", "allocate"),
    ("raises", "exception", "RuntimeError"),
    ("fd_hog", "resource_limit", "RLIMIT_NOFILE"),
])
async def test_bad_runtime_behaviour_is_a_result(tmp_path, cpu_example, candidate, name, kind, says):
    args = {"backend": "cpu", "reference_code": cpu_example["reference"], "trials": 1}
    async with stdio_session(tmp_path, **_ENV) as client:
        result = await client.call_tool("verify_against_reference", {**args, "candidate_code": candidate(name)})
        assert not result.is_error, result.content[0].text
        verdict = result.structured_content
        assert not verdict["correct"] and not verdict["ok"]
        failure = verdict["failure"]
        assert failure["kind"] == kind, failure
        assert says in failure["message"] or says in (failure.get("traceback_tail") or ""), failure
        if name == "raises":
            assert failure["line"] == 12 and failure["stage"] == "forward"
        # The same server still answers, and still runs candidates correctly.
        ok = await client.call_tool("verify_against_reference", {**args, "candidate_code": candidate("chatty")})
        assert ok.structured_content["correct"]


async def test_a_hang_is_called_from_the_reference_time_not_the_worker_deadline(tmp_path, cpu_example, candidate):
    """With the default 600 s worker deadline, a candidate that never returns is called hung after 20x the
    reference's own time for the same calls, at least the 30 s floor: well before 600 s."""
    import time

    args = {"backend": "cpu", "reference_code": cpu_example["reference"], "trials": 1, "use_store": False}
    async with stdio_session(tmp_path) as client:
        t0 = time.perf_counter()
        verdict = (await client.call_tool("verify_against_reference", {**args, "candidate_code": candidate("endless")})
                   ).structured_content
        took = time.perf_counter() - t0
        if verdict.get("job_id"):  # outlasted the call's wait: follow the job
            verdict = (await client.call_tool("get_job", {"job_id": verdict["job_id"], "wait_s": 300})).structured_content
    failure = verdict["failure"]
    assert failure["kind"] == "timeout" and "x the reference's" in failure["message"] and "at least 30 s" in failure["message"]
    assert took < 200, f"called hung after {took:.0f} s"


_DIES_IN_BFLOAT16 = '''
import os
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        if x.dtype == torch.bfloat16:  # the judge's bfloat16 null candidate runs the reference this way
            os._exit(7)
        return torch.relu(x)


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return []
'''

_RELU = _DIES_IN_BFLOAT16.replace("class Model", "class ModelNew").replace("os._exit(7)", "pass")


async def test_a_judge_that_dies_beside_the_candidates_call_is_the_references_failure(tmp_path):
    """The judge's null candidates run while the candidate's worker runs its trial (a small problem); when the
    judge dies there, the verdict blames the reference, never the candidate, and the server goes on."""
    import json

    args = {"backend": "cpu", "reference_code": _DIES_IN_BFLOAT16, "trials": 2, "use_store": False}
    trace = tmp_path / "trace.jsonl"
    async with stdio_session(tmp_path, KFORGE_TRACE=str(trace)) as client:
        verdict = (await client.call_tool("verify_against_reference", {**args, "candidate_code": _RELU})
                   ).structured_content
        assert not verdict["correct"] and verdict["failure"]["stage"] == "reference", verdict["failure"]
        assert "the reference failed, not the candidate" in verdict["failure"]["message"]
        plain = _DIES_IN_BFLOAT16.replace("os._exit(7)", "pass")
        ok = (await client.call_tool("verify_against_reference", {**args, "reference_code": plain,
                                                                  "candidate_code": _RELU})).structured_content
        assert ok["correct"], ok
    spans = [json.loads(line) for line in trace.read_text().splitlines()]
    calibrations = [s for s in spans if (s["role"], s["op"]) == ("judge", "calibrate")]
    trials = [s for s in spans if (s["role"], s["op"]) == ("candidate", "trial")]
    assert any(t["at"] < c["at"] + c["s"] and c["at"] < t["at"] + t["s"] for c in calibrations for t in trials), spans
