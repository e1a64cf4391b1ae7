"""The candidate's worker (`kforge.tools.harness.worker`, role candidate): runs ModelNew, never sees an expected output.

`trial` executes ModelNew on the judge's inputs and gathers the evidence the verdict needs, beside
each call and outside any timed window: outputs that alias inputs, inputs the call modified, the
same inputs run again after the allocator was poisoned with NaN (unwritten or stale output shows),
threads or processes left running, harness functions or numerics flags changed, and whether the
candidate's own kernels ran. `time` times it on fresh inputs and keeps a secret random sample of
timed outputs for the judge to re-validate.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..process import protocol as p
from .bench import Bench
from .compare import flatten_outputs
from .handoff import return_free_memory
from .inputs import SeededSets, build_model, poison_allocator, probe_preserving_
from .output_contract import aliased_outputs, modified_inputs
from .session import Session

__all__ = ["Candidate"]


class Candidate:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.bench = Bench(session)
        self.model: Any = None  # ModelNew, with the reference's initial weights (`setup`)
        self.sets: Any = None  # the trial inputs (`inputs.SeededSets`), made from the judge's seeds
        self._output_sizes: list[int] = []  # the last trial's output bytes: what `repeat` poisons

    @property
    def backend(self) -> Any:
        return self.session.backend

    def handlers(self) -> dict[type[p.Request[Any]], Callable[[Any], p.OpReply]]:
        return {p.LoadRequest: self.session.load, p.SetupRequest: self.setup, p.TrialRequest: self.trial,
                p.RepeatRequest: self.repeat, p.DecoyRequest: self.decoy, p.ReleaseRequest: self.release,
                p.EvidenceRequest: self.evidence, p.TimingSetsRequest: self.timing_sets, p.TimeRequest: self.time,
                p.AnchorRequest: self.anchor, p.TimingDecoyRequest: self.timing_decoy, p.ProfileRequest: self.profile,
                p.ResetRequest: self.reset}

    def reset(self, req: p.ResetRequest) -> p.ResetReply:
        """Forget the job, keeping the loaded module (`ResetRequest`): the state is a new Candidate's."""
        return self.session.forget_job(self, Candidate(self.session))

    def setup(self, req: p.SetupRequest) -> p.SetupReply:
        """Build ModelNew with the reference's initial weights; the trial inputs are made from the seeds.

        The inputs and the reference's initial weights are made here from the judge's seeds, as the judge
        made them: nothing of the problem's size travels between the two processes."""
        init_seed = req.init_seed
        try:
            reference = self.session.inputs_module(req.reference_source)
            self.sets = SeededSets(reference, req.seeds, ["native"] * len(req.seeds), self.backend)
            torch.manual_seed(init_seed)
            init_inputs = list(reference.get_init_inputs())
            reference_state = build_model(lambda: reference.Model(*init_inputs), init_seed, self.backend).state_dict()
        except BaseException as exc:  # noqa: BLE001 - the judge ran it; here it can only fail for want of memory
            return p.SetupReply(failure=self.session.failure(exc, "reference"))
        try:
            model = build_model(lambda: self.session.module.ModelNew(*init_inputs), init_seed, self.backend)
        except BaseException as exc:  # noqa: BLE001
            return p.SetupReply(failure=self.session.failure(exc, "init"))
        sync = _copy_weights(model, reference_state)
        del reference_state
        self.model = model
        return p.SetupReply(weights=sync)

    def trial(self, req: p.TrialRequest) -> p.TrialReply:
        """Run trial i on fresh inputs of the judge's distribution; hold the outputs for the judge.

        Beside the outputs: where they live, whether they alias an input, which inputs the call wrote
        into, and (`repeat`) the same inputs run again after the allocator was poisoned with NaN."""
        i, shelf = req.i, self.session.shelf
        shelf.clear()
        self.sets.variants[i] = req.variant
        try:
            with torch.no_grad():
                args = self.sets.fresh(i)
                out = flatten_outputs(self.model(*args))
                self.backend.synchronize()
                record: dict[str, Any] = {
                    "devices": [str(o.device) if isinstance(o, torch.Tensor) else None for o in out],
                    "aliases": aliased_outputs(out, args), "inputs_modified": modified_inputs(args, self.sets.fresh(i))}
                record["outputs"] = shelf.put(out) if req.share else []
                self._output_sizes = [o.numel() * o.element_size() for o in out if isinstance(o, torch.Tensor)]
                if req.repeat:
                    del out, args  # (the shelf may still hold the outputs: the judge reads them)
                    record["repeat"] = shelf.put(self._run_poisoned(i))
        except BaseException as exc:  # noqa: BLE001
            return p.TrialReply(**self._failed_forward(exc))
        return p.TrialReply(**record)

    def _run_poisoned(self, i: int) -> list[Any]:
        """Trial i's inputs again, after the allocator was poisoned with NaN where the last outputs' sizes fit. The
        inputs are made first: made after, they took the start of the poisoned block, and an output as large as the
        block went to memory of its own, not poisoned (level1/63: 1.07 GB of inputs, an 8.55 GB output; the repeat
        reserved 17.4 GB, H200 2026-12-03)."""
        args = self.sets.fresh(i)
        poison_allocator(self._output_sizes, self.backend)
        again = flatten_outputs(self.model(*args))
        del args
        self.backend.synchronize()
        return again

    def _failed_forward(self, exc: BaseException) -> dict[str, Any]:
        """A trial's record when the candidate's call raised: nothing held for the judge, the failure located."""
        self.session.shelf.clear()
        f = self.session.failure(exc, "forward")
        return {"error": f.message + (f" (line {f.line})" if f.line else ""), "failure": f}

    def repeat(self, req: p.RepeatRequest) -> p.RepeatReply:
        """Trial i's inputs again after the allocator was poisoned with NaN, its outputs held for the judge: the
        repeat of `trial` on its own, once the judge has let go of the first outputs (a problem whose two
        runs' outputs and the judge's expected ones would not fit on the device at once)."""
        self.session.shelf.clear()
        try:
            with torch.no_grad():
                again = self._run_poisoned(req.i)
                return p.RepeatReply(repeat=self.session.shelf.put(again),
                                     devices=[str(o.device) if isinstance(o, torch.Tensor) else None for o in again])
        except BaseException as exc:  # noqa: BLE001
            return p.RepeatReply(**self._failed_forward(exc))

    def decoy(self, req: p.DecoyRequest) -> p.DecoyReply:
        """Trial 0's inputs (a fresh copy) through `_decoy_record`."""
        try:
            args = self.sets.fresh(0)
        except BaseException as exc:  # noqa: BLE001 - e.g. a device the candidate's earlier fault left unusable
            return p.DecoyReply(decoy_shift=req.shift, error=self.session.failure(exc, "forward").message)
        return p.DecoyReply(**self._decoy_record(args, req.shift, "forward"))

    def release(self, req: p.ReleaseRequest) -> p.ReleaseReply:
        """The judge is done with the held outputs; their memory goes back to the device for the judge's next
        trial (a no-op for small problems, whose blocks are soon cached again). Timed outputs kept for the
        judge are let go too: it has read them (released only after the timing's revalidation)."""
        self.session.shelf.clear()
        self.bench.release_kept()
        return_free_memory(self.backend)
        return p.ReleaseReply()

    def evidence(self, req: p.EvidenceRequest) -> p.EvidenceReply:
        """What the verdict needs beside the outputs, gathered after the trials."""
        return p.EvidenceReply(jit_kernels=self._jit_kernels(), integrity=self.session.integrity(),
                               custom_work=self._custom_work() if req.custom_work else None)

    def _decoy_record(self, args: list[Any], shift: int, stage: str) -> dict[str, Any]:
        """Run the model on `args` once, then again after they were changed in place where a cheap probe cannot
        see it (`inputs.probe_preserving_`): the second call's outputs, held for the judge, or why it failed."""
        shelf = self.session.shelf
        shelf.clear()
        try:
            with torch.no_grad():
                self.model(*args)
                probe_preserving_(args, shift)
                out = flatten_outputs(self.model(*args))
                self.backend.synchronize()
                outputs = shelf.put(out)
        except BaseException as exc:  # noqa: BLE001
            shelf.clear()
            return {"decoy_shift": shift, "error": self.session.failure(exc, stage).message}
        return {"decoy_shift": shift, "outputs": outputs}

    def _jit_kernels(self) -> list[dict[str, Any]]:
        """Kernels the backend compiled while the candidate ran (Triton); resource data is best effort."""
        try:
            return self.backend.jit_kernels(self.session.module)
        except Exception as exc:  # noqa: BLE001 - an unknown Triton layout must not fail a verified run
            print(f"kforge: could not read compiled kernel metadata: {type(exc).__name__}: {exc}", file=sys.stderr)
            return []

    def _trial_args(self, i: int) -> list[Any]:
        """Fresh device copies of trial input set i."""
        raw = self.sets[i % len(self.sets)]
        return self.backend.to_device([a.clone() if isinstance(a, torch.Tensor) else a for a in raw])

    def _custom_work(self) -> dict[str, Any]:
        """Did the candidate's own kernels run in one call, and what share of its time did they take?"""
        from kforge.profilers.torch_profiler import (CUSTOM_PREFIX, collect_op_table, custom_share,
                                                     label_extension_functions)

        extensions, kernel_names = self.session.extensions, self.session.kernel_names
        own = [getattr(e, "__name__", "ext") for e in extensions] + kernel_names
        if not own:
            return {"own": [], "ran": [], "share": None, "observable": True}
        try:
            with torch.no_grad(), label_extension_functions(extensions) as returned:
                rows, total, basis, *_ = collect_op_table(self.model, self._trial_args, self.backend, calls=1,
                                                         trace_path=None, custom_kernels=kernel_names)
        except BaseException as exc:  # noqa: BLE001 - the verdict says it could not tell
            return {"own": own, "ran": [], "share": None, "observable": False,
                    "note": f"the profiler failed: {type(exc).__name__}: {exc}"[:200]}
        # A labelled extension call counts only if it returned (a fallback catches the ones that raised).
        ran = sorted({r.name for r in rows if r.is_custom and r.calls > 0
                      and (not r.name.startswith(CUSTOM_PREFIX) or returned.get(r.name))})
        rows = [r if r.name in ran or not r.is_custom else r.model_copy(update={"is_custom": False}) for r in rows]
        # Kernels run by Triton's interpreter or by a pure-Python function are invisible to the profiler.
        observable = bool(extensions) or basis == "device"
        return {"own": own, "ran": ran, "share": custom_share(rows, total, basis), "observable": observable,
                "basis": basis}

    def timing_sets(self, req: p.TimingSetsRequest) -> p.TimingSetsReply:
        """The timing inputs, made from the reference's `get_inputs` loaded beside the candidate."""
        # The trials are over: free their inputs and outputs before the timing sets take their place.
        self.session.shelf.clear()
        if hasattr(self.sets, "drop"):
            self.sets.drop()
        try:
            source = self.session.inputs_module(req.reference_source)
        except BaseException as exc:  # noqa: BLE001
            return p.TimingSetsReply(failure=self.session.failure(exc, "reference"))
        return self.bench.make_sets(source, req.seeds)

    def time(self, req: p.TimeRequest) -> p.TimeReply:
        return self.bench.time(req, self.model)

    def anchor(self, req: p.AnchorRequest) -> p.AnchorReply:
        """`calls` calls back to back, walking through the timing sets (together larger than the caches, so a
        call's inputs are not where the last call left them; no flush, no copies), then a device sync: the server
        times this op with its own clock, N and 2N calls (`kforge.tools.profile._wall_anchor`)."""
        if req.calls:
            sets = self.bench.timing_sets
            try:
                with torch.no_grad():
                    for i in range(req.calls):
                        self.model(*sets[i % len(sets)])
                    self.backend.synchronize()
            except BaseException as exc:  # noqa: BLE001
                return p.AnchorReply(failure=self.session.failure(exc, "timing"))
        return p.AnchorReply(calls=req.calls)

    def timing_decoy(self, req: p.TimingDecoyRequest) -> p.TimingDecoyReply:
        """`_decoy_record` on timing set 0 itself, the tensors the timed calls saw (run after the judge read
        the timed outputs)."""
        record = self._decoy_record(self.bench.timing_sets[0], req.shift, "timing")
        return_free_memory(self.backend)  # the first of its two calls' outputs
        return p.TimingDecoyReply(**record, call=-1, set=0)

    def profile(self, req: p.ProfileRequest) -> p.ProfileReply:
        from kforge.profilers import load_profiler
        from kforge.profilers.torch_profiler import collect_op_table, label_extension_functions

        trace = Path(req.artifacts) / "trace.json"
        try:
            with torch.no_grad(), label_extension_functions(self.session.extensions):
                table = collect_op_table(self.model, self.bench.timing_args, self.backend, calls=req.calls,
                                         trace_path=trace, custom_kernels=self.session.kernel_names)
            perf, i = None, 0
            if req.counters:  # the device's counter profiler where it collects in the worker (perf on CPUs)
                with torch.no_grad(), load_profiler(req.counters).collect() as perf:
                    t_end = time.perf_counter() + req.perf_seconds
                    while time.perf_counter() < t_end:
                        self.model(*self.bench.timing_args(i))
                        i += 1
                    self.backend.synchronize()
        except BaseException as exc:  # noqa: BLE001
            return p.ProfileReply(failure=self.session.failure(exc, "profile"))
        return p.ProfileReply(rows=table.rows, total_us=table.total_us, basis=table.basis,
                              device_launches=table.device_launches, host_launches=table.host_launches,
                              trace=trace.name if trace.exists() else None,
                              counters=perf.counters if perf else [], counters_note=perf.note if perf else None,
                              perf_calls=i, facts=self.backend.facts())


def _copy_weights(model: Any, reference_state: dict[str, Any]) -> dict[str, Any]:
    """Give ModelNew the reference's initial parameters and buffers, matched by name and shape."""
    own = model.state_dict()
    copied, unmatched = 0, []
    with torch.no_grad():
        for name, value in reference_state.items():
            if name in own and own[name].shape == value.shape:
                own[name].copy_(value)
                copied += 1
            else:
                unmatched.append(name)
    return {"copied": copied, "reference_total": len(reference_state), "unmatched": unmatched[:20]}
