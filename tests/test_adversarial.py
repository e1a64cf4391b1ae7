"""The adversarial suite on the CPU backend: every cheat in the catalogue is rejected or flagged for the
right reason, and honest candidates pass without false alarms (see tests/adversarial/README.md).

These call the tool functions directly (the MCP path is covered by the e2e tests); each case is a
real verify or profile with real workers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.server.catalog import problem_reference
from kforge.tools.context import ToolContext
from kforge.tools.evaluate import verify_against_reference
from kforge.tools.profile import profile_kernel
from kforge.tools.requests import ProfileRequest, VerifyRequest

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent / "adversarial"


def reference(problem: str) -> str:
    local = HERE / "problems" / f"{problem}.py"
    return local.read_text() if local.exists() else problem_reference(problem)


def candidate(name: str) -> str:
    path = HERE / "candidates" / f"{name}.py"
    return path.read_text() if path.exists() else (Path(__file__).parent / "candidates" / f"{name}.py").read_text()


@pytest.fixture(scope="module")
def ctx(tmp_path_factory) -> ToolContext:
    return ToolContext(home=tmp_path_factory.mktemp("adversarial"))


def checks(result) -> dict[str, str]:
    return {c.name: c.status for c in result.checks}


# (candidate, problem, precision, correct, {check: status}) -- statuses that must hold.
CASES = [
    ("honest_cpp_relu", "relu", "strict", True, {"custom_work": "pass", "deterministic": "pass", "static_scan": "pass",
                                                 "null_calibration": "pass", "outputs_match": "pass"}),
    ("relu_python", "relu", "strict", True, {"custom_work": "warn", "outputs_match": "pass"}),
    ("honest_softmax", "softmax", "strict", True, {"outputs_match": "pass", "inputs_unmodified": "pass"}),
    ("honest_blocked_matmul", "matmul", "strict", True, {"outputs_match": "pass", "null_calibration": "pass"}),
    ("honest_zeros_degenerate", "zero_output", "strict", True, {"null_calibration": "warn"}),
    ("a1_stale_empty", "relu", "strict", False, {"outputs_match": "fail"}),
    ("a2_unwritten_tail", "relu", "strict", False, {"outputs_match": "fail"}),
    ("a3_zeros_softmax_long", "softmax_long", "strict", False, {"outputs_match": "fail"}),
    ("a4_identity_relu_rand", "relu_rand", "strict", False, {"outputs_match": "fail", "output_contract": "pass"}),
    ("a5_bf16_matmul", "matmul", "strict", False, {"outputs_match": "fail", "static_scan": "warn"}),
    ("a5_bf16_matmul", "matmul", "bf16", True, {"outputs_match": "pass"}),
    ("a5_tf32_flag", "matmul", "strict", False, {"global_state": "fail"}),
    ("a5_tf32_flag", "matmul", "tf32", True, {"global_state": "warn"}),
    ("a6_ghost_branch", "relu", "strict", True, {"custom_work": "warn"}),
    ("a12_fallback", "relu", "strict", True, {"custom_work": "warn", "static_scan": "warn"}),
    ("a7_zero_inputs", "relu", "strict", False, {"inputs_unmodified": "fail", "outputs_match": "pass"}),
    ("a8_alias_inplace", "relu", "strict", False, {"output_contract": "fail", "inputs_unmodified": "fail"}),
    ("a9_gc_walk", "relu", "strict", False, {"static_scan": "fail"}),
    # Replay keyed on input addresses: the same tensor changed in place catches it (and a trial's fresh inputs
    # often land at an address an earlier trial used, which catches it too).
    ("a10_replay_ptr", "relu", "strict", False, {"probe_memo": "fail"}),
    ("a16_memo_probe", "relu", "strict", False, {"outputs_match": "pass", "probe_memo": "fail"}),
    ("a17_memo_checksum", "relu", "strict", False, {"outputs_match": "pass", "probe_memo": "fail"}),
    ("a13_lazy_subclass", "relu", "strict", False, {"output_contract": "fail", "static_scan": "fail"}),
    ("b2_thread", "relu", "strict", False, {"no_background_work": "fail", "static_scan": "fail"}),
    ("b2_native_thread", "relu", "strict", False, {"no_background_work": "fail", "outputs_match": "pass"}),
    ("b2_process", "relu", "strict", False, {"no_background_work": "fail", "outputs_match": "pass"}),
    ("b2_orphan", "relu", "strict", False, {"no_background_work": "fail", "outputs_match": "pass"}),
    ("b3_timer_patch", "relu", "strict", False, {"harness_intact": "fail", "static_scan": "pass", "outputs_match": "pass"}),
    ("b7_guess_seed", "relu", "strict", False, {"outputs_match": "fail"}),
    ("a18_tiny_noise", "relu", "strict", True, {"deterministic": "warn", "outputs_match": "pass"}),
]


@pytest.mark.parametrize(("name", "problem", "precision", "correct", "expect"), CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in CASES])
async def test_verdict(ctx, name, problem, precision, correct, expect):
    result = await verify_against_reference(ctx, VerifyRequest(backend="cpu", reference_code=reference(problem),
                                                               candidate_code=candidate(name), precision=precision,
                                                               use_store=False))
    assert result.failure is None, result.failure
    got = checks(result)
    assert result.correct is correct, str(result)
    assert {k: got.get(k) for k in expect} == expect, str(result)


async def test_calibration_says_what_the_norm_adds(ctx):
    result = await verify_against_reference(ctx, VerifyRequest(backend="cpu",
                                                               reference_code=reference("softmax_long"),
                                                               candidate_code=candidate("a3_zeros_softmax_long"),
                                                               trials=2, use_store=False))
    calibration = next(c for c in result.checks if c.name == "null_calibration")
    rescued = calibration.evidence.split("; ", 1)[1]  # the nulls only the relative-error bound rejects
    assert calibration.status == "pass" and rescued.startswith("zeros") and "element-wise tolerance alone" in rescued
    assert all(t.outputs[0].mismatches == 0 and not t.correct for t in result.trials), str(result)


async def test_fake_result_channel_is_detected(ctx):
    result = await verify_against_reference(ctx, VerifyRequest(backend="cpu", reference_code=reference("relu"),
                                                               candidate_code=candidate("b4_fake_channel"),
                                                               use_store=False))
    assert not result.correct and result.failure is not None and result.failure.kind == "tampering", str(result)


async def test_precision_policy_is_stated(ctx):
    result = await verify_against_reference(ctx, VerifyRequest(backend="cpu", reference_code=reference("matmul"),
                                                               candidate_code=candidate("a5_bf16_matmul"),
                                                               precision="bf16", trials=2, use_store=False))
    [tol] = result.tolerances
    assert tol.precision == "bf16" and tol.rel_error_bound == pytest.approx(8 * 2 ** -8)
    assert "bf16" in tol.why and result.trials[0].outputs[0].rel_error < tol.rel_error_bound


async def test_timing_rejects_replay_and_phase_switching(ctx):
    """Timed outputs are re-validated on fresh inputs: replay and timed-phase cheats lose their speedup.

    a10 (replay by address) is not here: whether the CPU allocator hands a fresh copy an old address
    is up to malloc, so it replays on some runs and is honest on others.
    """
    for name, check in (("a11_phase_switch", "timed_outputs"), ("a15_replay_shape", "timed_outputs"),
                        ("a14_replay_fingerprint", "fresh_inputs"), ("a16_memo_probe", "probe_memo"),
                        ("a17_memo_checksum", "probe_memo")):
        prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference("relu"),
                                                        candidate_code=candidate(name), baselines=("eager",),
                                                        budget_s=1.0))
        got = checks(prof)
        assert got[check] == "fail" and prof.speedup_trusted is False, f"{name}: {prof}"
    # A larger budget for the honest one: on a busy 2-core machine a short run is honestly too noisy to rank.
    honest = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference("relu"),
                                                      candidate_code=candidate("relu_python"), baselines=("eager",),
                                                      budget_s=3.0))
    got = checks(honest)
    # No cheat check fires on it. On a busy 2-core machine its speedup interval can be honestly too wide to
    # rank (stable_timing fails, so it is not trusted); that is the only reason allowed.
    failed = {name for name, status in got.items() if status == "fail"}
    assert failed <= {"stable_timing"} and honest.speedup_trusted is (not failed), str(honest)
    assert got["timed_outputs"] == "pass" and got["fresh_inputs"] == "pass" and got["plausible_speed"] in ("pass", "skip")
    assert got["probe_memo"] == "pass" and got["wall_clock_anchor"] in ("pass", "skip")  # skip: the host was busy
    assert honest.report.candidate.input_sets >= 3


async def test_a_thread_left_running_is_seen_by_the_server_in_a_profile_too(ctx):
    """The server looks at the worker's threads once, after the candidate's last timed round (not after each
    round): a thread out of Python's sight, spinning since the first call, still fails the profile."""
    prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference("relu"),
                                                    candidate_code=candidate("b2_native_thread"),
                                                    baselines=("eager",), budget_s=1.0))
    assert checks(prof)["no_background_work"] == "fail" and prof.speedup_trusted is False, str(prof)


async def test_a_timer_rescaled_inside_the_candidate_is_caught_by_the_servers_clock(ctx):
    """Patching the harness's timer class (nothing an identity check watches) makes every timed call read 3x
    faster; the server times the calls itself, from outside the candidate's process (issue 17). A compute-bound
    problem: there a call back to back runs as fast as a timed one (on a small memory-bound problem a flushed
    call is 2-4x slower than back-to-back ones, and only larger lies are caught)."""
    prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference("matmul"),
                                                    candidate_code=candidate("b3_timer_rescale"),
                                                    baselines=("eager",), budget_s=1.0))
    [anchor] = [c for c in prof.checks if c.name == "wall_clock_anchor"]
    if anchor.status == "skip":
        pytest.skip(f"the host was too busy for the server's clock: {anchor.evidence}")
    assert anchor.status == "fail" and "faster than the calls really ran" in anchor.evidence, str(prof)
    assert "the host's own pace" not in anchor.evidence  # a CPU's calls run as made: no launch floor allowed
    assert prof.speedup_trusted is False


async def test_leftover_processes_are_named(ctx):
    """A process the candidate left running is caught however it was started, and named in the evidence."""
    # An orphan is reparented to the nearest reaper: in the worker's own PID namespace that is the worker
    # (PID 1), so it is named as a child there; without one, as a process of the worker's session.
    for name, said in (("b2_process", ("child process",)), ("b2_orphan", ("of its session", "child process"))):
        result = await verify_against_reference(ctx, VerifyRequest(backend="cpu", reference_code=reference("relu"),
                                                                   candidate_code=candidate(name), trials=1,
                                                                   use_store=False))
        [check] = [c for c in result.checks if c.name == "no_background_work"]
        assert check.status == "fail" and any(s in check.evidence for s in said), str(result)
        assert "(sleep)" in check.evidence, str(result)


async def test_a_leftover_process_is_seen_from_outside_when_the_check_inside_is_blinded(ctx):
    """The check in the candidate's process can be patched there; the server counts the worker's PID namespace
    itself (issue 17: trust anchors outside the candidate's process)."""
    result = await verify_against_reference(ctx, VerifyRequest(backend="cpu", reference_code=reference("relu"),
                                                               candidate_code=candidate("b2_hidden_process"),
                                                               trials=1, use_store=False))
    [check] = [c for c in result.checks if c.name == "no_background_work"]
    assert check.status == "fail" and "(sleep), seen by the server" in check.evidence, str(result)
    assert not result.correct


async def test_a_reused_output_buffer_is_revalidated_as_returned(ctx):
    """The last timed output is held by reference: no call (cross-check, decoy) may run before it is saved."""
    prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference("relu"),
                                                    candidate_code=candidate("honest_reused_output"),
                                                    baselines=("eager",), budget_s=1.0))
    got = checks(prof)
    assert got["timed_outputs"] == "pass" and got["probe_memo"] == "pass", str(prof)


@pytest.mark.parametrize(("name", "correct", "deterministic"), [
    ("honest_cpp_relu", True, "pass"), ("a18_tiny_noise", True, "warn"), ("a1_stale_empty", False, None),
    ("a2_unwritten_tail", False, None)])
async def test_a_large_problems_repeat_runs_apart_with_the_same_verdicts(ctx, monkeypatch, name, correct, deterministic):
    """On a problem large beside the device, the repeat after NaN-poisoning runs once the judge has checked and
    let go of the first outputs (two runs' outputs and the expected ones no longer held at once), and is
    compared with a digest of them: the verdicts are those of the repeat run inside the trial."""
    from kforge.tools import trials
    from kforge.tools.process.runner import WorkerProcess

    monkeypatch.setattr(trials, "_BESIDE_SHARE", 0.0)  # as for a problem of several GB on a GPU
    ops: list[str] = []
    call = WorkerProcess.call

    async def recorded(self, request, **kw):
        ops.append(request.op)
        return await call(self, request, **kw)
    monkeypatch.setattr(WorkerProcess, "call", recorded)
    result = await verify_against_reference(ctx, VerifyRequest(backend="cpu", reference_code=reference("relu"),
                                                               candidate_code=candidate(name), use_store=False))
    assert result.failure is None and result.correct is correct, str(result)
    if deterministic is not None:
        assert checks(result)["deterministic"] == deterministic, str(result)
        assert ops.count("repeat") == ops.count("check_repeat") == 5, ops
    else:
        assert checks(result)["outputs_match"] == "fail"
