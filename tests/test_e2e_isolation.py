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
