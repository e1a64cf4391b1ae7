"""The result store persists across instances, keeps artifact paths inside the data directory, and keeps
only answers that depend on nothing but the code and the inputs."""

import json
import sqlite3
import time
from contextlib import closing

import pytest

from kforge.tools.context import ToolContext
from kforge.tools.evaluate import _finish_verify
from kforge.tools.models import Check, Failure, JobSpec, TrialReport
from kforge.tools.store import ResultStore
from kforge.tools.verdict import why_not_stored


def test_results_and_profiles_survive_a_new_instance(tmp_path):
    ResultStore(tmp_path).put_result("k1", "compile_kernel", {"ok": True})
    ResultStore(tmp_path).put_profile("abc123", "k2", "cpu", {"profile_id": "abc123"})
    again = ResultStore(tmp_path)
    got = again.get_result("k1")
    assert got == {"ok": True, "stored_at": got["stored_at"]} and again.get_result("nope") is None
    assert time.time() - 60 < got["stored_at"] <= time.time()
    assert again.get_profile("abc123") == {"profile_id": "abc123"}
    assert again.latest_profile_for("k2")["profile_id"] == "abc123"
    assert again.list_profiles()[0]["profile_id"] == "abc123"


def test_artifacts_cannot_escape(tmp_path):
    store = ResultStore(tmp_path)
    (store.artifact_dir("p1") / "trace.json").write_text("{}")
    assert store.artifact_path("p1", "trace.json").read_text() == "{}"
    assert store.artifact_names("p1") == ["trace.json"]
    for bad in ("../kforge.db", "..", "/etc/passwd", ".hidden"):
        assert store.artifact_path("p1", bad) is None
    assert store.artifact_path("../p1", "trace.json") is None


def _failure(kind: str, stage: str = "forward", **extra) -> dict:
    return Failure(stage=stage, kind=kind, message=extra.pop("message", "it went wrong"), **extra).model_dump(mode="json")


def _check(name: str, status: str = "fail") -> dict:
    return Check(name=name, status=status, hard=True, evidence="e").model_dump(mode="json")


_PASSING = [_check(n, "pass") for n in ("static_scan", "harness_intact", "no_background_work", "outputs_match")]

STORED = {
    "correct": {"ok": True, "correct": True, "checks": _PASSING},
    "wrong output": {"ok": True, "correct": False, "checks": [_check("outputs_match")],
                     "trials": [{"trial": 0, "correct": False, "error": None}]},
    "a trial that raised": {"ok": True, "correct": False, "checks": [_check("outputs_match")],
                            "trials": [{"trial": 1, "correct": False, "error": "ValueError: bad shape (line 9)"}]},
    "build error": {"ok": False, "correct": False, "failure": _failure("build_error", "build", message="'x' was not declared")},
    "syntax error": {"ok": False, "failure": _failure("syntax_error", "load")},
    "interface error": {"ok": False, "failure": _failure("interface_error", "load")},
    "cheat in the source": {"ok": True, "correct": False, "checks": [_check("static_scan")]},
    "patched timer": {"ok": True, "correct": False, "checks": [_check("harness_intact")]},
    "TF32 flag": {"ok": True, "correct": False, "checks": [_check("global_state")]},
    "inputs written": {"ok": True, "correct": False, "checks": [_check("inputs_unmodified"), _check("output_contract")]},
    "stale memory": {"ok": True, "correct": False, "checks": [_check("deterministic")]},
    "soft warnings": {"ok": True, "correct": True, "checks": [_check("custom_work", "warn"), _check("visible_work", "warn")]},
}
NOT_STORED = {
    "timeout": {"ok": False, "failure": _failure("timeout")},
    "crash (OOM killer)": {"ok": False, "failure": _failure("crashed", message="killed by SIGKILL")},
    "exit": {"ok": False, "failure": _failure("exited")},
    "out of memory": {"ok": False, "failure": _failure("out_of_memory")},
    "device fault": {"ok": False, "failure": _failure("device_fault")},
    "exception": {"ok": False, "failure": _failure("exception")},
    "import error": {"ok": False, "failure": _failure("import_error", "load")},
    "tampering": {"ok": False, "failure": _failure("tampering")},
    "reference build error": {"ok": False, "failure": _failure("build_error", "reference")},
    "reference timeout": {"ok": False, "failure": _failure("timeout", "reference")},
    "compiler killed": {"ok": False, "failure": _failure(
        "build_error", "build", output_tail="c++: fatal error: Killed signal terminated program cc1plus")},
    "disk full": {"ok": False, "failure": _failure("build_error", "build", message="No space left on device")},
    "background work": {"ok": True, "correct": False,
                        "checks": [_check("no_background_work"), *_PASSING[:2], _check("outputs_match", "pass")]},
    "replay suspected (timing)": {"ok": True, "checks": [_check("fresh_inputs")]},
    "implausible speed": {"ok": True, "checks": [_check("plausible_speed")]},
    "a check the rule does not know": {"ok": True, "correct": False, "checks": [_check("added_later")]},
    "a trial out of memory": {"ok": True, "correct": False, "checks": [_check("outputs_match")], "trials": [
        {"trial": 2, "correct": False, "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"}]},
    "verify of a compile that crashed": {"ok": False, "compile": {"ok": False, "failure": _failure("crashed", "load")}},
}


@pytest.mark.parametrize("name", list(STORED))
def test_answers_that_depend_only_on_code_are_stored(tmp_path, name):
    result = {**STORED[name], "spec": {"tool": "verify_against_reference"}}
    assert why_not_stored(result) is None
    store = ResultStore(tmp_path)
    assert store.put_result("k", "verify_against_reference", result)
    assert {k: v for k, v in store.get_result("k").items() if k != "stored_at"} == result


@pytest.mark.parametrize("name", list(NOT_STORED))
def test_answers_the_environment_decided_are_not_stored(tmp_path, name):
    result = NOT_STORED[name]
    assert why_not_stored(result)
    store = ResultStore(tmp_path)
    assert not store.put_result("k", "verify_against_reference", result)
    assert store.get_result("k") is None


def test_a_false_verdict_stored_before_the_rule_is_not_served(tmp_path):
    """Stores written by earlier versions hold verdicts such as a no_background_work failure: never served again."""
    store = ResultStore(tmp_path)
    with closing(sqlite3.connect(store.path)) as db, db:
        db.execute("INSERT INTO results VALUES (?, ?, ?, ?)",
                   ("k", "verify_against_reference", time.time(), json.dumps(NOT_STORED["background work"])))
    assert store.get_result("k") is None
    with closing(sqlite3.connect(store.path)) as db:
        assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 0


def test_profiles_are_all_kept_but_only_code_decided_ones_are_served_again(tmp_path):
    store = ResultStore(tmp_path)
    store.put_profile("good", "k", "cpu", {"profile_id": "good", "ok": True, "checks": [_check("fresh_inputs", "pass")]})
    time.sleep(0.01)
    store.put_profile("noisy", "k", "cpu", {"profile_id": "noisy", "ok": True,
                                            "checks": [_check("no_background_work"), _check("plausible_speed")]})
    assert store.get_profile("noisy")["profile_id"] == "noisy"  # its resource and summarize_profile still read it
    served = store.latest_profile_for("k")
    assert served["profile_id"] == "good" and served["stored_at"] > 0
    store.put_profile("only-noisy", "k2", "cpu", {"profile_id": "only-noisy", "ok": True,
                                                  "checks": [_check("fresh_inputs")]})
    assert store.latest_profile_for("k2") is None


def _spec() -> JobSpec:
    return JobSpec(tool="verify_against_reference", backend="cpu", candidate_sha256="c" * 64,
                   reference_sha256="r" * 64)


def _trial(correct: bool, error: str | None = None) -> TrialReport:
    return TrialReport(trial=0, seed=1, correct=correct, outputs=[], error=error)


def _chk(name: str, status: str) -> Check:
    return Check(name=name, status=status, hard=True, evidence="e")


@pytest.mark.parametrize(("fields", "stored"), [
    ({"trials": [_trial(True)], "checks": [_chk("outputs_match", "pass"), _chk("no_background_work", "pass")]}, True),
    ({"trials": [_trial(False)], "checks": [_chk("outputs_match", "fail")]}, True),
    ({"failure": Failure(stage="build", kind="build_error", message="error: expected ';'")}, True),
    ({"trials": [_trial(True)], "checks": [_chk("outputs_match", "pass"), _chk("no_background_work", "fail")]}, False),
    ({"failure": Failure(stage="forward", kind="timeout", message="no answer within 600 s")}, False),
    ({"failure": Failure(stage="forward", kind="crashed", message="killed by SIGKILL")}, False),
    ({"failure": Failure(stage="reference", kind="exception", message="the reference failed, not the candidate")}, False),
], ids=["correct", "wrong output", "build error", "background work", "timeout", "killed", "reference failed"])
def test_verify_stores_only_verdicts_of_the_code(tmp_path, fields, stored):
    ctx = ToolContext(home=tmp_path)
    result = _finish_verify(ctx, _spec(), time.perf_counter(), **fields)
    hit = ctx.store.get_result(result.spec.key)
    assert (hit is not None) is stored, str(result)
    if stored:
        assert hit["correct"] == result.correct and hit["checks"] == [c.model_dump(mode="json") for c in result.checks]
