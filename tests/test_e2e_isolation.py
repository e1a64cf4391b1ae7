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
