"""The worker protocol is typed (issue 18): one request and one reply model per op (`kforge.tools.process.protocol`),
used by the server (`WorkerProcess.call`) and by the worker (its roles' handler tables); unknown ops, requests that
do not validate and malformed replies are rejected with a message that names the op."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Literal

import pytest

from kforge.tools.process import protocol as p
from kforge.tools.process.runner import HarnessError, ProtocolViolation, WorkerProcess
from kforge.tools.process.limits import WorkerLimits

# Every op the server calls, and the role whose worker serves it.
_OPS = {
    "probe": "host", "ceilings": "host",
    "load": "judge+candidate", "timing_sets": "judge+candidate", "time": "judge+candidate",
    "prepare": "judge", "expect": "judge", "check": "judge", "check_repeat": "judge", "calibrate": "judge",
    "problem_size": "judge", "check_decoy": "judge", "revalidate": "judge", "read_report": "judge",
    "launch_floor": "judge", "pace": "judge", "precompile": "judge", "reset": "judge+candidate",
    "setup": "candidate", "trial": "candidate", "repeat": "candidate", "decoy": "candidate", "release": "candidate",
    "evidence": "candidate", "anchor": "candidate", "timing_decoy": "candidate", "profile": "candidate",
}

_REFERENCE = """
import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(8))
    def forward(self, x):
        return x * self.scale
def get_inputs():
    return [torch.randn(4, 8)]
def get_init_inputs():
    return []
"""
_CANDIDATE = _REFERENCE.replace("class Model(", "class ModelNew(")


def test_every_op_has_one_request_and_one_reply_model():
    assert set(p.REQUESTS) == set(_OPS)
    replies = set()
    for op, request in p.REQUESTS.items():
        assert request.model_fields["op"].default == op
        assert issubclass(request.reply, p.OpReply) and request.reply is not p.OpReply, op
        replies.add(request.reply)
    assert len(replies) == len(p.REQUESTS)  # one reply model per op, none shared


def test_each_role_serves_its_ops_and_only_through_the_protocol_s_requests():
    from kforge.tools.harness.candidate import Candidate
    from kforge.tools.harness.judge import Judge
    from kforge.tools.harness.session import Session
    from kforge.tools.harness.worker import Host, dispatch_table

    session = Session(backend=None, scratch=None, cache_dir=None)  # type: ignore[arg-type]
    served = {name: set(dispatch_table(cls(session))) for name, cls in
              (("judge", Judge), ("candidate", Candidate), ("host", Host))}
    for op, roles in _OPS.items():
        assert {r for r in served if op in served[r]} == set(roles.split("+")), op


def test_the_protocol_module_is_server_safe():
    code = "import sys, kforge.tools.process.protocol, kforge.tools.process.runner; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_a_request_that_does_not_validate_or_names_no_known_op_is_refused_clearly():
    with pytest.raises(p.ProtocolError, match=r"unknown worker op 'nope'; known: anchor, calibrate, "):
        p.parse_request({"op": "nope"})
    with pytest.raises(p.ProtocolError, match=r"worker op 'trial': the request does not validate: i: "):
        p.parse_request({"op": "trial", "i": "first"})
    with pytest.raises(p.ProtocolError, match=r"worker op 'release'.*extra: Extra inputs are not permitted"):
        p.parse_request({"op": "release", "extra": 1})


def test_a_malformed_reply_is_refused_with_the_op_and_what_was_wrong():
    with pytest.raises(p.ProtocolError, match=r"worker op 'expect' sent a malformed reply \(ExpectReply\): .*"
                                              r"must have distribution, seconds, exact"):
        p.parse_reply(p.ExpectRequest(i=1), {"note": None})
    with pytest.raises(p.ProtocolError, match=r"worker op 'check' sent a malformed reply \(CheckReply\): trial: "):
        p.parse_reply(p.CheckRequest(i=0, record=p.TrialReply(outputs=[])), {"trial": [1, 2]})
    # A failure alone is a valid reply of any op (a candidate that took every file descriptor fails any op).
    failed = p.parse_reply(p.ExpectRequest(i=1), {"failure": {"stage": "expect", "kind": "resource_limit",
                                                              "message": "out of descriptors"}})
    assert failed.failure is not None and failed.failure.kind == "resource_limit"


def test_the_judges_verdicts_on_trials_nulls_repeats_decoys_and_timed_calls_are_typed():
    """The nested payloads that decide checks (a trial's checks, null calibration, the NaN-poisoned repeat, the
    probe-keyed decoy, the re-validated timed calls) are models: a misspelt or missing field is refused at the boundary, not read as absent."""
    calibrate = p.CalibrateRequest(i=0)
    nulls = p.parse_reply(calibrate, {"nulls": [{"null": "zeros", "applicable": True, "passes": False,
                                                 "elementwise_passes": True}]})
    assert nulls.nulls == [p.NullOutcome(null="zeros", elementwise_passes=True)]
    with pytest.raises(p.ProtocolError, match=r"'calibrate' .*nulls\.0\.pass"):
        p.parse_reply(calibrate, {"nulls": [{"null": "zeros", "pass": True}]})
    with pytest.raises(p.ProtocolError, match=r"'check' .*trial\.inputs_modified"):
        p.parse_reply(p.CheckRequest(i=0, record=p.TrialReply(outputs=[])), {"trial": {"inputs_modified": "all"}})
    check_repeat = p.CheckRepeatRequest(i=0, record=p.RepeatReply(error="x"))
    with pytest.raises(p.ProtocolError, match=r"'check_repeat' .*repeat_correct"):
        p.parse_reply(check_repeat, {"repeat": {"repeat_identical": True}})
    decoy = p.CheckDecoyRequest(record=p.DecoyReply(decoy_shift=1, error="x"))
    with pytest.raises(p.ProtocolError, match=r"'check_decoy' .*decoy\.correct"):
        p.parse_reply(decoy, {"decoy": {"problems": []}})
    revalidate = p.RevalidateRequest(items=[])
    with pytest.raises(p.ProtocolError, match=r"'revalidate' .*wrong\.0\.call"):
        p.parse_reply(revalidate, {"checked": 3, "wrong": [{"problems": ["max abs error 1"]}]})


def test_a_null_passes_only_if_it_passes_every_trial_and_one_not_applicable_never_passes():
    from kforge.tools.trials import TrialsOutcome, _merge_nulls

    outcome = TrialsOutcome()
    first = p.CalibrateReply(nulls=[p.NullOutcome(null="zeros", passes=True, elementwise_passes=True),
                                    p.NullOutcome(null="a constant", passes=True),
                                    p.NullOutcome(null="the first input", applicable=False, passes=True, note="shape")])
    assert _merge_nulls(outcome, first) == ["zeros", "a constant"]
    second = p.CalibrateReply(nulls=[p.NullOutcome(null="zeros", elementwise_passes=True)])
    assert _merge_nulls(outcome, second) == ["zeros", "a constant"]  # zeros still passes element-wise
    merged = {n.null: n for n in outcome.nulls}
    assert not merged["zeros"].passes and merged["zeros"].elementwise_passes
    assert merged["the first input"] == p.NullOutcome(null="the first input", applicable=False, note="shape")


# -- through a real worker process (cpu backend) --------------------------------------------------------------

pytestmark = pytest.mark.anyio


def _worker(tmp_path, role: str) -> WorkerProcess:
    limits = WorkerLimits(timeout_s=120, sandbox=False, isolate_network=False)
    return WorkerProcess(backend="cpu", home=tmp_path, scratch=tmp_path / "jobs" / role, limits=limits, role=role)


async def test_a_candidate_round_trip_returns_typed_replies(tmp_path):
    async with _worker(tmp_path, "candidate") as w:
        loaded = await w.call(p.LoadRequest(role="candidate", source=_CANDIDATE), stage="load")
        assert isinstance(loaded, p.LoadReply) and loaded.failure is None and loaded.seconds >= 0
        setup = await w.call(p.SetupRequest(reference_source=_REFERENCE, init_seed=3, seeds=[5]), stage="init")
        assert isinstance(setup, p.SetupReply) and setup.weights is not None and setup.weights.copied == 1
        trial = await w.call(p.TrialRequest(i=0, repeat=False, share=False), stage="forward")
        assert isinstance(trial, p.TrialReply) and trial.error is None and trial.devices == ["cpu"]
        evidence = await w.call(p.EvidenceRequest(custom_work=False), stage="forward")
        assert isinstance(evidence, p.EvidenceReply) and evidence.integrity is not None


async def test_a_judge_prepares_and_a_failure_comes_back_as_a_failure_model(tmp_path):
    async with _worker(tmp_path, "judge") as w:
        loaded = await w.call(p.LoadRequest(role="reference", source=_REFERENCE.replace("return []", "return [1/0]")),
                              stage="reference")
        assert loaded.failure is None
        prepared = await w.call(p.PrepareRequest(init_seed=1, seeds=[2]), stage="reference")
        assert prepared.failure is not None and "ZeroDivisionError" in prepared.failure.message


async def test_an_unknown_op_is_refused_by_the_worker_with_the_ops_it_knows(tmp_path, monkeypatch):
    class Bogus(p.Request[p.ReleaseReply]):
        op: Literal["no_such_op"] = "no_such_op"

    monkeypatch.delitem(p.REQUESTS, "no_such_op")  # known to this test only, never to the worker
    async with _worker(tmp_path, "candidate") as w:
        with pytest.raises(HarnessError, match=r"unknown worker op 'no_such_op'; known: anchor, calibrate, "):
            await w.call(Bogus(), stage="forward")
        with pytest.raises(HarnessError, match=r"worker op 'prepare' is not served by a candidate worker; its ops: "):
            await w.call(p.PrepareRequest(init_seed=1, seeds=[2]), stage="reference")
        # The worker goes on serving after a refused op.
        assert (await w.call(p.LoadRequest(role="candidate", source=_CANDIDATE), stage="load")).failure is None


async def test_a_reply_that_does_not_fit_its_model_is_a_protocol_violation_naming_the_op(tmp_path, monkeypatch):
    class StricterReply(p.OpReply):
        weights: dict[str, int]  # what a setup reply never carries in this form

    monkeypatch.setattr(p.ReleaseRequest, "reply", StricterReply)
    async with _worker(tmp_path, "candidate") as w:
        await w.call(p.LoadRequest(role="candidate", source=_CANDIDATE), stage="load")
        await w.call(p.SetupRequest(reference_source=_REFERENCE, init_seed=3, seeds=[5]), stage="init")
        with pytest.raises(ProtocolViolation, match=r"worker op 'release' sent a malformed reply \(StricterReply\): "
                                                    r"weights: Field required"):
            await w.call(p.ReleaseRequest(), stage="forward")


def test_nan_in_a_payload_crosses_as_nan_not_as_null():
    """A wrong output's NaN is evidence: the judge's checks and open payloads keep it (pydantic's JSON mode would write
    None by default)."""
    import json
    import math

    from kforge.tools.models import Mismatch, OutputCheck, TensorInfo

    check = OutputCheck(output=0, correct=False, expected=TensorInfo(kind="tensor"), got=TensorInfo(kind="tensor"),
                        max_abs_error=math.nan, first_mismatches=[Mismatch(index=[0], got=math.nan, expected=1.0)])
    reply = p.CheckReply(trial=p.TrialVerdict(checks=[check]))
    wire = json.loads(json.dumps(reply.model_dump(mode="json")))  # as the channel writes and reads it
    got = p.parse_reply(p.CheckRequest(i=0, record=p.TrialReply(outputs=[])), wire)
    assert math.isnan(got.trial.checks[0].first_mismatches[0].got) and math.isnan(got.trial.checks[0].max_abs_error)
    request = p.CheckRequest(i=0, record=p.TrialReply(outputs=[{"non_tensor": "float", "x": math.inf}]))
    assert math.isinf(p.parse_request(json.loads(json.dumps(request.model_dump(mode="json")))).record.outputs[0]["x"])


async def test_the_servers_clock_times_a_candidate_and_the_judges_launch_floor_in_the_same_rounds(tmp_path):
    """`profile._wall_anchor` with a judge (what a device clock gets): the candidate's back-to-back calls and the
    judge's one-element launches, each timed by the server's clock from outside both processes."""
    from types import SimpleNamespace

    from kforge.tools.profile import _wall_anchor

    async with _worker(tmp_path, "candidate") as cand, _worker(tmp_path, "judge") as judge:
        await cand.call(p.LoadRequest(role="candidate", source=_CANDIDATE), stage="load")
        await cand.call(p.SetupRequest(reference_source=_REFERENCE, init_seed=3, seeds=[5]), stage="init")
        made = await cand.call(p.TimingSetsRequest(seeds=[7, 8], reference_source=_REFERENCE), stage="timing")
        assert made.failure is None and made.count == 2
        floor = await judge.call(p.LaunchFloorRequest(calls=50), stage="timing")
        assert floor.failure is None and floor.calls == 50
        limits = SimpleNamespace(hang_deadline=lambda call_s, n: (60.0, "a test's deadline"))
        # A median of 5 us asks for 200 calls an op: their difference (~0.5 ms for this tiny op) stands above a
        # loaded host's jitter, where 50 calls' (at 20 us) read 0 beside a CI run (2-core VM, 2026-11-28).
        anchor = await _wall_anchor(cand, 5.0, None, limits, judge)
        plain = await _wall_anchor(cand, 5.0, None, limits)
        # A call of 10 ms or more is timed in ops of 1 and 2 calls (the round trip's jitter is ~1% of one), 0.5-5 ms
        # ones in ops of at least 3.
        long_calls = await _wall_anchor(cand, 20_000.0, None, limits)
        mid_calls = await _wall_anchor(cand, 2_000.0, None, limits)
    assert anchor is not None and plain is not None and plain["floor_us"] is None
    assert anchor["calls"] == math.ceil(1e-3 / (5.0 * 1e-6)) and long_calls["calls"] == 1 and mid_calls["calls"] == 3
    if anchor["per_call_us"] is None or anchor["floor_us"] is None or anchor["batches"] < 3:
        pytest.skip(f"the host was too busy for the server's clock ({anchor['batches']} clean pairs of "
                    f"{anchor['tried']} tried)")
    # A Python call of a one-element op costs microseconds, not nothing and not milliseconds.
    assert 0.2 < anchor["floor_us"] < 2000, anchor
    assert anchor["per_call_us"] > 0 and anchor["batches"] >= 3, anchor


async def test_a_candidates_triton_kernels_are_named_as_its_own_whatever_its_backend(tmp_path):
    """A kernel compiled at first launch (a Triton jit function in the candidate's module) is the candidate's own,
    named in its load reply (the profile counts its share, ncu keeps its rows), found through the backends'
    `kernel_modules`: here in a cpu worker, as a cuda candidate may define Triton kernels too."""
    pytest.importorskip("triton")
    source = ("import triton\nimport triton.language as tl\n" + _CANDIDATE +
              "\n@triton.jit\ndef scale_kernel(x_ptr, n, BLOCK: tl.constexpr):\n    pass\n\nNOT_A_KERNEL = len\n")
    async with _worker(tmp_path, "candidate") as w:
        loaded = await w.call(p.LoadRequest(role="candidate", source=source), stage="load")
    assert loaded.failure is None, loaded.failure
    assert loaded.kernel_names == ["scale_kernel"]
