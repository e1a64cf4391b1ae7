"""The judge (`kforge.tools.harness.worker`, role judge): runs only in the judge worker.

The judge loads the reference and, one trial at a time, makes the trial's inputs on its device from a
seed the server chose after the candidate was loaded, computes the expected outputs (and, where the
reference runs in float64 and there is room, the exact ones) and keeps them in its own memory. It
compares the candidate's outputs in place (`kforge.tools.harness.handoff`), calibrates the check against
trivial "null" candidates, and re-validates outputs the candidate produced while being timed. Only one
trial's inputs and outputs live at a time, so a problem of several GB fits. The candidate never
receives an expected output.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ..process import protocol as p
from .bench import Bench
from .compare import compare_outputs, flatten_outputs, tensor_info
from .handoff import open_outputs, release_opened, return_free_memory
from .inputs import SeededSets, VARIANTS, build_model, probe_preserving_, to_float64
from .output_contract import digest_weights, same_values, value_digest
from .session import Session

__all__ = ["Judge"]


def _tensor_bytes(values: list[Any]) -> int:
    """Bytes held by the tensors among `values`."""
    return sum(t.numel() * t.element_size() for t in values if isinstance(t, torch.Tensor))


_CHUNK_ELEMENTS = 1 << 24  # a whole-tensor op's temporaries, kept to a few hundred MB however large the output


def _chunks(t: Any) -> Any:
    """Views of `t` of at most `_CHUNK_ELEMENTS` each, sliced along its first dimension (and a row too large, along
    its own): no copy, whatever its strides (`reshape(-1)` copies a non-contiguous output whole)."""
    if t.dim() == 0 or t.numel() <= _CHUNK_ELEMENTS:
        yield t
        return
    rows = _CHUNK_ELEMENTS // (t.numel() // t.shape[0])
    if rows == 0:
        for row in t:
            yield from _chunks(row)
        return
    for lo in range(0, t.shape[0], rows):
        yield t[lo:lo + rows]


def _mean64(t: Any) -> float:
    """The mean in float64 without a float64 copy of the whole tensor."""
    return sum(float(c.sum(dtype=torch.float64)) for c in _chunks(t)) / max(1, t.numel())


def _all_finite(outputs: list[Any]) -> bool:
    """Whether every floating output is finite, a chunk at a time: `torch.isfinite` of a whole tensor makes an `abs`
    copy and two masks, 13.9 GB beside level1/63's 8.6 GB output in each of the verify's three variant trials (H200,
    2026-12-03)."""
    return all(bool(torch.isfinite(c).all()) for o in outputs if isinstance(o, torch.Tensor) and o.is_floating_point()
               for c in _chunks(o))


# The float64 run of the reference (the exact outputs) is skipped when its inputs and outputs in float64
# would take more than this share of the device's memory: the judge would crowd out the candidate ...
_EXACT_MEMORY_SHARE = 0.125
# ... or more than this: beside the verify's own ~2.5x the footprint, the float64 run (4x the footprint in inputs
# and outputs, and its intermediates) took a Conv2d+InstanceNorm problem of 1.6 GB to 5.7x (H100, 2026-11-24).
# Below it, the problem is small against the workers' device contexts anyway.
_EXACT_MAX_BYTES = 2 * 2**30
_REAL_FLOP_COUNT_BYTES = 2**30  # where meta cannot count a call's FLOPs, a real call counts them up to this size
# A FLOP count (an op at a time through a Python dispatch mode) is given up past this: on the meta device an LSTM runs
# decomposed step by step, and KernelBench level3/35's count took 12.5 s of a 28 s profile (H200, 2026-12-01).
_FLOP_COUNT_S = 1.0


class _CountTooSlow(Exception):
    pass


class _CountDeadline(TorchDispatchMode):
    """Entered inside a FlopCounterMode: ends a count that outlasts `seconds` (`_CountTooSlow`)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.end = time.perf_counter() + seconds

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if time.perf_counter() > self.end:
            raise _CountTooSlow
        return func(*args, **(kwargs or {}))


def _judged_how(judging: p.Judging) -> tuple[Any, ...]:
    """What decides a check's verdict besides the outputs: its tolerances and precision."""
    return tuple(getattr(judging, name) for name in p.Judging.model_fields)


class Judge:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.bench = Bench(session)  # the baselines' timing (eager, torch.compile)
        self.model: Any = None  # the reference's Model, with the weights of the init seed (`prepare`)
        self.init_inputs: list[Any] = []
        self.sets: Any = None  # the trial inputs (`inputs.SeededSets`), made from the server's secret seeds
        self.distributions: list[str | None] = []  # per trial: the input distribution it used
        self.want_variants, self.want_exact = True, True
        self.exact_note: str | None = None  # why there are no exact (float64) outputs, once known
        # The current trial's (`expect`): its expected outputs, their devices, the exact ones, its index.
        self.expected: list[Any] = []
        self.expected_devices: list[str | None] = []
        self.exact: list[Any] = []
        self.expected_index: int | None = None
        self.input_bytes = 0
        self._input_shapes: list[Any] = []  # the trial's inputs on the meta device (`problem_size`)
        self._model64: Any = None  # the reference in float64 (exact outputs) ...
        self._model_bf16: Any = None  # ... and in bfloat16 (a null candidate)
        self._first_digests: list[Any] = []  # digests of a trial's first outputs (`check_repeat`)
        self._first_checks: tuple[Any, list[Any]] | None = None  # ... and how they were judged, and their checks
        self._weights: Any = None  # ... and their secret weights, drawn once
        self._floor: Any = None  # the module and one-element input of `launch_floor`

    @property
    def backend(self) -> Any:
        return self.session.backend

    def handlers(self) -> dict[type[p.Request[Any]], Callable[[Any], p.OpReply]]:
        return {p.LoadRequest: self.session.load, p.PrepareRequest: self.prepare, p.ExpectRequest: self.expect,
                p.CheckRequest: self.check, p.CheckRepeatRequest: self.check_repeat, p.CalibrateRequest: self.calibrate,
                p.ProblemSizeRequest: self.problem_size, p.CheckDecoyRequest: self.check_decoy,
                p.RevalidateRequest: self.revalidate, p.TimingSetsRequest: self.timing_sets, p.TimeRequest: self.time, p.PaceRequest: self.pace,
                p.PrecompileRequest: self.precompile,
                p.LaunchFloorRequest: self.launch_floor, p.ReadReportRequest: self.read_report, p.ResetRequest: self.reset}

    def _reference_outputs(self, model: Any, inputs: list[Any], cast: Any = None) -> list[Any]:
        """The reference's outputs on `inputs`, on its device. `inputs` are the call's own: a set made for it
        (`SeededSets.fresh`), which the reference may write into; the caller keeps no other reference, so a
        cast (`cast`) frees the originals before the call."""
        args = list(inputs)
        del inputs
        if cast is not None:
            args = [cast(a) for a in args]
        with torch.no_grad():
            out = flatten_outputs(model(*self.backend.to_device(args)))
        del args
        self.backend.synchronize()
        self.expected_devices = [str(o.device) if isinstance(o, torch.Tensor) else None for o in out]
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in out]

    def prepare(self, req: p.PrepareRequest) -> p.PrepareReply:
        """Build Model with the initial weights of `init_seed`, and trial 0's expected outputs (timed)."""
        self.backend.strict_numerics()  # the reference is the truth: no TF32, no reduced-precision reductions
        seeds, module = req.seeds, self.session.module
        try:
            torch.manual_seed(req.init_seed)
            init_inputs = self.init_inputs = list(module.get_init_inputs())
            self.model = build_model(lambda: module.Model(*init_inputs), req.init_seed, self.backend)
            self.sets = SeededSets(module, seeds, ["native"] * len(seeds), self.backend)
            self.distributions = [None] * len(seeds)
            self.want_variants, self.want_exact = req.variants, req.exact
            self.exact_note = None if self.want_exact else "not requested"
            t0 = time.perf_counter()  # a first call, cold: initialization, autotuning, lazy modules
            self._reference_outputs(self.model, self.sets.fresh(0))
            cold = time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001
            return p.PrepareReply(failure=self.session.failure(exc, "reference"))
        first = self.expect(p.ExpectRequest(i=0))  # warm: what a candidate's hang deadline is scaled from
        if first.failure is not None:
            return p.PrepareReply(failure=first.failure)
        return p.PrepareReply(expected=[tensor_info(o) for o in self.expected], distribution=first.distribution,
                              note=first.note, exact=first.exact, exact_note=first.exact_note,
                              reference_call_s=min(cold, first.seconds),
                              footprint_bytes=self.input_bytes + _tensor_bytes(self.expected),
                              capacity_bytes=self.backend.memory_capacity())

    def expect(self, req: p.ExpectRequest) -> p.ExpectReply:
        """Trial i's expected outputs (and exact ones), replacing the previous trial's; its distribution."""
        i = req.i
        self.expected, self.exact, self.expected_index = [], [], None  # free the last trial's first
        note = None
        try:
            variant = VARIANTS[i % len(VARIANTS)][0] if self.want_variants else "native"
            self.sets.variants[i] = variant
            inputs = self.sets.fresh(i)
            self.input_bytes = _tensor_bytes(inputs)
            self._input_shapes = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in inputs]
            t0 = time.perf_counter()
            out = self._reference_outputs(self.model, inputs)
            seconds = time.perf_counter() - t0
            del inputs
            if variant != "native" and not _all_finite(out):
                self.sets.variants[i] = "native"
                native_out = self._reference_outputs(self.model, self.sets.fresh(i))
                if _all_finite(native_out):  # the variant left the reference's domain
                    note = (f"trial {i}: the reference is not finite on {variant} inputs, so it used the native "
                            "distribution")
                    out, variant = native_out, "native"
                else:
                    self.sets.variants[i] = variant
            self.expected, self.expected_index = out, i
            self.distributions[i] = variant
            del out
            if self.want_exact and self.exact_note is None:
                self.exact_note = self._exact_outputs(i)
        except BaseException as exc:  # noqa: BLE001
            return p.ExpectReply(failure=self.session.failure(exc, "reference"))
        finally:
            return_free_memory(self.backend)
        return p.ExpectReply(distribution=variant, note=note, seconds=seconds, exact=bool(self.exact),
                             exact_note=self.exact_note)

    def _exact_outputs(self, i: int) -> str | None:
        """The reference's outputs on trial i in float64 (`self.exact`); None, or why it could not run so."""
        self.exact = []
        if (why := self._exact_too_large()) is not None:
            return why
        try:
            if self._model64 is None:
                self._model64 = copy.deepcopy(self.model).double()
            self.exact = self._reference_outputs(self._model64, self.sets.fresh(i), cast=to_float64)
        except Exception as exc:  # noqa: BLE001 - an op without a float64 kernel: fall back to fixed bounds
            self.exact, self._model64 = [], None
            if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc):
                return f"the reference's float64 run ran out of memory ({str(exc)[:120]})"
            return f"the reference does not run in float64 ({type(exc).__name__}: {str(exc)[:120]})"
        return None

    def _exact_too_large(self) -> str | None:
        outputs = _tensor_bytes(self.expected)
        # Inputs and outputs in float64 (up to twice their float32 size), and the reference's copies of them.
        as64 = 2 * 2 * (self.input_bytes + outputs)
        capacity = self.backend.memory_capacity()
        limit = min(_EXACT_MEMORY_SHARE * capacity, _EXACT_MAX_BYTES)
        if as64 > limit:
            return (f"not run: in float64 the problem would take {as64 / 2**30:.1f} GiB, over the "
                    f"{limit / 2**30:.1f} GiB kept for it ({_EXACT_MEMORY_SHARE:.0%} of the device's "
                    f"{capacity / 2**30:.0f} GiB, at most {_EXACT_MAX_BYTES / 2**30:.0f} GiB, so verify stays within "
                    "about 3x the problem's footprint); errors are measured against the reference in its own precision")
        return None

    def _compare(self, got: list[Any], judging: p.Judging, devices: list[str | None] | None = None,
                 expected: list[Any] | None = None, exact: list[Any] | None = None,
                 read_as_expected: bool = False, verdict_only: bool = False) -> list[Any]:
        return compare_outputs(self.expected if expected is None else expected, got, atol=judging.atol,
                               rtol=judging.rtol, expected_devices=self.expected_devices, got_devices=devices,
                               precision=judging.precision,
                               exact=self.exact if exact is None else exact, device=self.backend.device,
                               read_as_expected=read_as_expected, verdict_only=verdict_only)

    def _current(self, i: int) -> None:
        if self.expected_index != i:
            raise RuntimeError(f"trial {i} was not prepared (the judge holds trial {self.expected_index})")

    def check(self, req: p.CheckRequest) -> p.CheckReply:
        """Judge trial i's record from the candidate's worker: its outputs, and its repeat after poisoning."""
        i, record, fds = req.i, req.record, self.session.received_fds
        self._current(i)
        started = time.perf_counter()
        got = open_outputs(record.outputs, fds, self.backend)
        opened = time.perf_counter()
        trial = p.TrialVerdict(distribution=self.distributions[i], aliases=record.aliases,
                               inputs_modified=record.inputs_modified, checks=self._compare(got, req, record.devices))
        compared = time.perf_counter()
        if req.digest:  # the repeat comes on its own (`check_repeat`), once these are let go
            weights = self._digest_weights()
            self._first_digests = [value_digest(g, weights) for g in got]
            self._first_checks = ((i, *_judged_how(req)), trial.checks)
        if record.repeat is not None:  # the same inputs again after poisoning memory with NaN
            again = open_outputs(record.repeat, fds, self.backend)
            identical = len(again) == len(got) and all(same_values(a, b) for a, b in zip(again, got))
            trial.repeat = self._repeat_verdict(again, req, record.devices, trial.checks if identical else None)
            del again
        del got
        release_opened(self.backend)
        return_free_memory(self.backend)
        self.session.trace_parts = {"open": opened - started, "compare": compared - opened,
                                    "repeat_and_release": time.perf_counter() - compared}
        return p.CheckReply(trial=trial)

    def check_repeat(self, req: p.CheckRepeatRequest) -> p.CheckRepeatReply:
        """Judge trial i's repeat, run on its own (`Candidate.repeat`): correct, and bitwise the first
        run's outputs as `check` digested them."""
        i, record = req.i, req.record
        self._current(i)
        again = open_outputs(record.repeat or [], self.session.received_fds, self.backend)
        weights = self._digest_weights()
        identical = len(again) == len(self._first_digests) and all(
            value_digest(a, weights) == d for a, d in zip(again, self._first_digests))
        first = self._first_checks
        same = first[1] if identical and first is not None and first[0] == (i, *_judged_how(req)) else None
        verdict = self._repeat_verdict(again, req, record.devices, same, identical)
        del again
        release_opened(self.backend)
        return_free_memory(self.backend)
        return p.CheckRepeatReply(repeat=verdict)

    def _repeat_verdict(self, again: list[Any], judging: p.Judging, devices: list[str | None],
                        first_checks: list[Any] | None, identical: bool | None = None) -> p.RepeatVerdict:
        """`first_checks`: the first run's checks under the same judging, where the repeat is bitwise that run's
        outputs (they are its checks too: a second compare of a 5 GB output took 0.4 s a trial, H200); else None."""
        rechecks = first_checks if first_checks is not None else self._compare(again, judging, devices)
        identical = first_checks is not None if identical is None else identical
        return p.RepeatVerdict(repeat_identical=identical, repeat_correct=all(c.correct for c in rechecks),
                               repeat_problems=[p for c in rechecks for p in c.problems][:3])

    def _digest_weights(self) -> Any:
        if self._weights is None:
            self._weights = digest_weights(self.backend.device)
        return self._weights

    def calibrate(self, req: p.CalibrateRequest) -> p.CalibrateReply:
        """Would trivial candidates pass trial i's check? Each null named in `nulls` is judged like a candidate."""
        i = req.i
        self._current(i)
        makers: dict[str, Any] = {
            "zeros": lambda e: [torch.zeros_like(o) if isinstance(o, torch.Tensor) else o for o in e],
            "a constant (the output's mean)": lambda e: [
                torch.full_like(o, _mean64(o)) if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                for o in e],
            "the first input, unchanged": lambda e: self._passthrough(i, e),
        }
        if req.precision == "strict":
            makers["the reference computed in bfloat16"] = lambda e: self._in_bfloat16(i, e)
        verdicts, parts = [], {}
        for name in req.nulls or list(makers):
            if name not in makers:
                continue
            started = time.perf_counter()
            outcome = p.NullOutcome(null=name)
            try:
                got = makers[name](self.expected)
                if got is None:
                    outcome.applicable = False
                else:
                    # What its values would pass as: only whether they pass (a null is wrong at its first chunk).
                    checks = self._compare(got, req, read_as_expected=True, verdict_only=True)
                    outcome.passes = all(c.correct for c in checks)
                    outcome.elementwise_passes = all(
                        c.mismatches == 0 and not c.nan_count and not c.inf_count
                        and not any("shape" in p or "dtype" in p for p in c.problems) for c in checks)
                del got
            except Exception as exc:  # noqa: BLE001 - a null the reference cannot produce is not applicable
                outcome.applicable, outcome.note = False, f"{type(exc).__name__}: {str(exc)[:120]}"
            verdicts.append(outcome)
            return_free_memory(self.backend)
            parts[name] = time.perf_counter() - started
        self.session.trace_parts = parts
        return p.CalibrateReply(nulls=verdicts)

    def _passthrough(self, i: int, expected: list[Any]) -> list[Any] | None:
        first = next((a for a in self.sets.fresh(i) if isinstance(a, torch.Tensor)), None)
        if first is None or len(expected) != 1 or not isinstance(expected[0], torch.Tensor) \
                or first.shape != expected[0].shape:
            return None
        return [first.to(expected[0].dtype)]

    def _in_bfloat16(self, i: int, expected: list[Any]) -> list[Any] | None:
        if not any(isinstance(o, torch.Tensor) and o.dtype in (torch.float32, torch.float64) for o in expected):
            return None
        if self._model_bf16 is None:
            self._model_bf16 = copy.deepcopy(self.model).to(torch.bfloat16)
        cast = lambda a: a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a  # noqa: E731
        devices = self.expected_devices
        out = self._reference_outputs(self._model_bf16, self.sets.fresh(i), cast=cast)
        self.expected_devices = devices
        # float32 and float64 outputs are compared as read in that dtype (`read_as_expected`; exact, every
        # bfloat16 being one), without a copy of the output in it; a narrower one is rounded as it would be.
        wide = (torch.float32, torch.float64)
        return [o.to(e.dtype) if isinstance(o, torch.Tensor) and isinstance(e, torch.Tensor) and e.dtype not in wide
                else o for o, e in zip(out, expected)]

    def problem_size(self, req: p.ProblemSizeRequest) -> p.ProblemSizeReply:
        """Bytes in and out of one call (a floor on its memory traffic) and its FLOPs, as torch counts them."""
        i = self.expected_index or 0
        outputs = _tensor_bytes(self.expected)
        flops = None
        # Counted on the meta device (shapes only): a real call held another set of inputs and outputs, several
        # GB on a large problem, beside the trial's. Counted for real only where meta cannot run it.
        attempts = [self._meta_call] + ([] if self.input_bytes + outputs > _REAL_FLOP_COUNT_BYTES else
                                        [lambda: self.model(*self.sets.fresh(i))])
        for call in attempts:
            try:
                with torch.no_grad(), FlopCounterMode(display=False) as counter, _CountDeadline(_FLOP_COUNT_S):
                    call()
                flops = int(counter.get_total_flops())
                break
            except Exception:  # noqa: BLE001 - an op the counter cannot trace, or a count too slow: try the next
                continue
        return_free_memory(self.backend)
        out = self.expected[0] if self.expected else None
        return p.ProblemSizeReply(problem_bytes=self.input_bytes + outputs, problem_flops=flops,
                                  dtype=str(out.dtype).removeprefix("torch.") if isinstance(out, torch.Tensor) else None)

    def _meta_call(self) -> None:
        """The reference called on the meta device: a model built there (no weights made) on inputs of the
        trial's shapes."""
        with torch.device("meta"):
            model = self.session.module.Model(*self.init_inputs)
        model(*self._input_shapes)

    def _judge_on(self, inputs: list[Any], outputs: list[dict[str, Any]], decoy_shift: int | None,
                  judging: p.Judging) -> tuple[bool, list[str]]:
        """Judge a candidate's outputs (descriptors) against the reference run now on `inputs`, or, for a decoy
        (`decoy_shift`), on a copy of them changed as the candidate's were."""
        if decoy_shift is not None:
            inputs = probe_preserving_(inputs, decoy_shift)
        expected = self._reference_outputs(self.model, inputs)
        del inputs
        got = open_outputs(outputs, self.session.received_fds, self.backend)
        checks = self._compare(got, judging, expected=expected, exact=[])
        del got, expected
        release_opened(self.backend)
        return_free_memory(self.backend)
        return all(c.correct for c in checks), [p for c in checks for p in c.problems][:2]

    def check_decoy(self, req: p.CheckDecoyRequest) -> p.CheckDecoyReply:
        """The candidate's call on trial 0's inputs changed in place where a cheap probe cannot see it."""
        decoy = req.record
        if decoy.error is not None:
            return p.CheckDecoyReply(decoy=p.DecoyVerdict(correct=False, error=decoy.error))
        self.expected, self.exact, self.expected_index = [], [], None  # the trials are done: make room
        ok, problems = self._judge_on(self.sets.fresh(0), decoy.outputs or [], decoy.decoy_shift, req)
        return p.CheckDecoyReply(decoy=p.DecoyVerdict(correct=ok, problems=problems))

    def revalidate(self, req: p.RevalidateRequest) -> p.RevalidateReply:
        """Compare outputs kept during timing with the reference on the same timing inputs."""
        wrong, decoy = [], None
        # The decoy last: its inputs are changed in place, on the timing set itself (no copy of a set that may be
        # several GB), which nothing uses after it.
        timing_sets = self.bench.timing_sets
        for item in sorted(req.items, key=lambda it: it.decoy_shift is not None):
            timing_set = timing_sets[item.set % len(timing_sets)]
            ok, problems = self._judge_on(list(timing_set), item.outputs, item.decoy_shift, req)
            if item.decoy_shift is not None:
                decoy = p.DecoyVerdict(correct=ok, problems=problems)
            elif not ok:
                wrong.append(p.WrongCall(call=item.call, problems=problems))
        if decoy is not None:  # the timing's last check: its inputs are not needed again
            self.bench.timing_sets = []
            return_free_memory(self.backend)
        return p.RevalidateReply(checked=len(req.items) - (decoy is not None), wrong=wrong, decoy=decoy)

    def timing_sets(self, req: p.TimingSetsRequest) -> p.TimingSetsReply:
        """The timing inputs, made from the reference's own `get_inputs`, for the baselines."""
        # The trials are over: free their inputs and outputs before the timing sets take their place.
        self.session.shelf.clear()
        self.expected, self.exact, self.expected_index = [], [], None
        if hasattr(self.sets, "drop"):
            self.sets.drop()
        return self.bench.make_sets(self.session.module, req.seeds)

    def time(self, req: p.TimeRequest) -> p.TimeReply:
        """One round of a baseline: the reference, eager or through torch.compile."""
        return self.bench.time(req, self.model)

    def precompile(self, req: p.PrecompileRequest) -> p.PrecompileReply:
        """torch.compile of the reference, compiled and not run (`Bench.precompile`)."""
        return self.bench.precompile(self.model)

    def pace(self, req: p.PaceRequest) -> p.PaceReply:
        """A baseline's device launches and busy time over a few calls (`Bench.pace`)."""
        return self.bench.pace(req, self.model)

    def launch_floor(self, req: p.LaunchFloorRequest) -> p.LaunchFloorReply:
        """`calls` calls of a module doing one op on a one-element tensor (a fresh output each, as a model's call
        makes), back to back, then a device sync: timed by the server, the host's own pace of Python calls and
        launches, which a launch-bound candidate's back-to-back calls cannot beat whatever its kernel's time."""
        if self._floor is None:
            self._floor = (torch.nn.ReLU(), torch.zeros(1, device=self.backend.device))
        module, x = self._floor
        with torch.no_grad():
            for _ in range(req.calls):
                module(x)
            self.backend.synchronize()
        return p.LaunchFloorReply(calls=req.calls)

    def reset(self, req: p.ResetRequest) -> p.ResetReply:
        """Forget the job, keeping only the loaded reference (`ResetRequest`): the state is a new Judge's."""
        return self.session.forget_job(self, Judge(self.session))

    def read_report(self, req: p.ReadReportRequest) -> p.ReadReportReply:
        """Kernels of a rerun profiler's report (Nsight Compute's report module runs here, not beside the candidate)."""
        from kforge.profilers import load_profiler

        try:
            profiler = load_profiler(req.profiler)
            kernels = profiler.read(Path(req.report), req.custom_names)
        except Exception as exc:  # noqa: BLE001 - a report we cannot read is a note, not a failed profile
            return p.ReadReportReply(kernels=[], note=f"could not read the {req.profiler} report: {type(exc).__name__}: {exc}")
        return p.ReadReportReply(kernels=kernels, note=None)
