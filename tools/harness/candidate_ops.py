"""The candidate worker's operations (a mixin of `kforge.tools.harness.worker.Worker`).

`run` executes ModelNew on the judge's inputs and gathers the evidence the verdict needs, beside
each call and outside any timed window: outputs that alias inputs, inputs the call modified, the
same inputs run again after the allocator was poisoned with NaN (unwritten or stale output shows),
threads or processes left running, harness functions or numerics flags changed, and whether the
candidate's own kernels ran. `time` times it on fresh inputs and keeps a secret random sample of
timed outputs for the judge to re-validate.
"""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .handoff import return_free_memory

__all__ = ["CandidateOps"]

_REVALIDATED_CALLS = 8  # timed outputs kept (a secret reservoir sample) for the judge, plus the last ...
_KEPT_OUTPUT_BYTES = 512 * 2**20  # ... as many of them as fit in this many bytes of device memory
_COPIED_SET_BYTES = 256 * 2**20  # timing input sets up to this size get a fresh copy per timed call


class CandidateOps:
    # State (set by Worker.__init__): module, model, backend, sets, extensions, kernel_names, snapshot, shelf,
    # _output_sizes.

    def op_setup(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Build ModelNew with the reference's initial weights; the trial inputs are made from the seeds.

        The inputs and the reference's initial weights are made here from the judge's seeds, as the judge
        made them: nothing of the problem's size travels between the two processes."""
        import torch

        from .inputs import SeededSets, build_model

        init_seed = msg["init_seed"]
        try:
            reference = self._inputs_module(msg["reference_source"])
            self.sets = SeededSets(reference, msg["seeds"], ["native"] * len(msg["seeds"]), self.backend)
            torch.manual_seed(init_seed)
            init_inputs = list(reference.get_init_inputs())
            reference_state = build_model(lambda: reference.Model(*init_inputs), init_seed, self.backend).state_dict()
        except BaseException as exc:  # noqa: BLE001 - the judge ran it; here it can only fail for want of memory
            return self._failure(exc, "reference")
        try:
            model = build_model(lambda: self.module.ModelNew(*init_inputs), init_seed, self.backend)
        except BaseException as exc:  # noqa: BLE001
            return self._failure(exc, "init")
        sync = _copy_weights(model, reference_state)
        del reference_state
        self.model = model
        return {"weights": sync}

    def op_trial(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Run trial i on fresh inputs of the judge's distribution; hold the outputs for the judge.

        Beside the outputs: where they live, whether they alias an input, which inputs the call wrote
        into, and (`repeat`) the same inputs run again after the allocator was poisoned with NaN."""
        import torch

        from .compare import flatten_outputs
        from .output_contract import aliased_outputs, modified_inputs

        i = msg["i"]
        self.shelf.clear()
        self.sets.variants[i] = msg.get("variant", "native")
        try:
            with torch.no_grad():
                args = self.sets.fresh(i)
                out = flatten_outputs(self.model(*args))
                self.backend.synchronize()
                record: dict[str, Any] = {
                    "devices": [str(o.device) if isinstance(o, torch.Tensor) else None for o in out],
                    "aliases": aliased_outputs(out, args), "inputs_modified": modified_inputs(args, self.sets.fresh(i))}
                record["outputs"] = self.shelf.put(out) if msg.get("share", True) else []
                self._output_sizes = [o.numel() * o.element_size() for o in out if isinstance(o, torch.Tensor)]
                if msg.get("repeat", True):
                    del out, args  # (the shelf may still hold the outputs: the judge reads them)
                    record["repeat"] = self.shelf.put(self._run_poisoned(i))
        except BaseException as exc:  # noqa: BLE001
            return self._failed_forward(exc)
        return record

    def _run_poisoned(self, i: int) -> list[Any]:
        """Trial i's inputs again, after the allocator was poisoned with NaN where the last outputs' sizes fit."""
        from .compare import flatten_outputs
        from .inputs import poison_allocator

        poison_allocator(self._output_sizes, self.backend.device)
        again = flatten_outputs(self.model(*self.sets.fresh(i)))
        self.backend.synchronize()
        return again

    def _failed_forward(self, exc: BaseException) -> dict[str, Any]:
        """A trial's record when the candidate's call raised: nothing held for the judge, the failure located."""
        self.shelf.clear()
        f = self._failure(exc, "forward")["failure"]
        return {"error": f["message"] + (f" (line {f['line']})" if f["line"] else ""), "failure": f}

    def op_repeat(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Trial i's inputs again after the allocator was poisoned with NaN, its outputs held for the judge: the
        repeat of `op_trial` on its own, once the judge has let go of the first outputs (a problem whose two
        runs' outputs and the judge's expected ones would not fit on the device at once)."""
        import torch

        self.shelf.clear()
        try:
            with torch.no_grad():
                again = self._run_poisoned(msg["i"])
                return {"repeat": self.shelf.put(again),
                        "devices": [str(o.device) if isinstance(o, torch.Tensor) else None for o in again]}
        except BaseException as exc:  # noqa: BLE001
            return self._failed_forward(exc)

    def op_decoy(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Trial 0's inputs (a fresh copy) through `_decoy_record`."""
        try:
            args = self.sets.fresh(0)
        except BaseException as exc:  # noqa: BLE001 - e.g. a device the candidate's earlier fault left unusable
            return {"decoy_shift": msg["shift"], "error": self._failure(exc, "forward")["failure"]["message"]}
        return self._decoy_record(args, msg["shift"], "forward")

    def op_release(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The judge is done with the held outputs; their memory goes back to the device for the judge's next
        trial (a no-op for small problems, whose blocks are soon cached again). Timed outputs kept for the
        judge are let go too: it has read them (released only after the timing's revalidation)."""
        self.shelf.clear()
        for series in self.series.values():
            series["keep"] = None
        return_free_memory(self.backend.device)
        return {}

    def op_evidence(self, msg: dict[str, Any]) -> dict[str, Any]:
        """What the verdict needs beside the outputs, gathered after the trials."""
        return {"jit_kernels": self._jit_kernels(), "integrity": self._integrity(),
                "custom_work": self._custom_work() if msg.get("custom_work", True) else None}

    def _decoy_record(self, args: list[Any], shift: int, stage: str) -> dict[str, Any]:
        """Run the model on `args` once, then again after they were changed in place where a cheap probe cannot
        see it (`inputs.probe_preserving_`): the second call's outputs, held for the judge, or why it failed."""
        import torch

        from .compare import flatten_outputs
        from .inputs import probe_preserving_

        self.shelf.clear()
        try:
            with torch.no_grad():
                self.model(*args)
                probe_preserving_(args, shift)
                out = flatten_outputs(self.model(*args))
                self.backend.synchronize()
                outputs = self.shelf.put(out)
        except BaseException as exc:  # noqa: BLE001
            self.shelf.clear()
            return {"decoy_shift": shift, "error": self._failure(exc, stage)["failure"]["message"]}
        return {"decoy_shift": shift, "outputs": outputs}

    def _integrity(self) -> dict[str, list[str]]:
        return {"tampering": self.snapshot.tampering(), "flags": self.snapshot.flag_changes(),
                "background": self.snapshot.background_work()}

    def _jit_kernels(self) -> list[dict[str, Any]]:
        """Kernels the backend compiled while the candidate ran (Triton); resource data is best effort."""
        try:
            return self.backend.jit_kernels(self.module)
        except Exception as exc:  # noqa: BLE001 - an unknown Triton layout must not fail a verified run
            print(f"kforge: could not read compiled kernel metadata: {type(exc).__name__}: {exc}", file=sys.stderr)
            return []

    def _custom_work(self) -> dict[str, Any]:
        """Did the candidate's own kernels run in one call, and what share of its time did they take?"""
        import torch

        from kforge.profilers.torch_profiler import (CUSTOM_PREFIX, collect_op_table, custom_share,
                                                     label_extension_functions)

        own = [getattr(e, "__name__", "ext") for e in self.extensions] + self.kernel_names
        if not own:
            return {"own": [], "ran": [], "share": None, "observable": True}
        try:
            with torch.no_grad(), label_extension_functions(self.extensions) as returned:
                rows, total, basis = collect_op_table(self.model, self._args, self.backend, calls=1, trace_path=None,
                                                      custom_kernels=self.kernel_names)
        except BaseException as exc:  # noqa: BLE001 - the verdict says it could not tell
            return {"own": own, "ran": [], "share": None, "observable": False,
                    "note": f"the profiler failed: {type(exc).__name__}: {exc}"[:200]}
        # A labelled extension call counts only if it returned (a fallback catches the ones that raised).
        ran = sorted({r.name for r in rows if r.is_custom and r.calls > 0
                      and (not r.name.startswith(CUSTOM_PREFIX) or returned.get(r.name))})
        rows = [r if r.name in ran or not r.is_custom else r.model_copy(update={"is_custom": False}) for r in rows]
        # Kernels run by Triton's interpreter or by a pure-Python function are invisible to the profiler.
        observable = bool(self.extensions) or basis == "device"
        return {"own": own, "ran": ran, "share": custom_share(rows, total, basis), "observable": observable,
                "basis": basis}

    def op_timing_sets(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Make the timing inputs on the device from the server's seeds (the judge and the candidate's
        process each make their own, bit-identical; nothing goes through a file)."""
        import torch

        from .inputs import seeded_inputs

        # The trials are over: free their inputs and outputs before the timing sets take their place.
        self.shelf.clear()
        self.expected, self.exact, self.expected_index = [], [], None
        if hasattr(self.sets, "drop"):
            self.sets.drop()
        try:
            source = self._inputs_module(msg.get("reference_source"))
            self.timing_sets = [seeded_inputs(source, seed, self.backend) for seed in msg["seeds"]]
        except BaseException as exc:  # noqa: BLE001
            return self._failure(exc, "reference")
        return_free_memory(self.backend.device)
        set_bytes = sum(a.numel() * a.element_size() for a in self.timing_sets[0] if isinstance(a, torch.Tensor))
        # A fresh copy per call keeps a candidate that writes into its inputs from changing the sets; for
        # sets too large to copy twice over, the sets are used as they are (verify checks input writes).
        self.copy_timing_inputs = set_bytes <= _COPIED_SET_BYTES
        return {"count": len(self.timing_sets), "set_bytes": set_bytes}

    def op_time(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time one round of one series ('candidate', 'eager', 'torch.compile'); the server interleaves rounds
        of the series so drift between them shows in the speedup's interval instead of biasing it."""
        import torch

        from .timing import ReplaySchedule, TimingPolicy, time_model

        label = msg["label"]
        policy = TimingPolicy(**msg.get("policy", {}))
        fn: Callable[..., Any] = self.model
        if label not in self.series:  # the first round of this series: its replay schedule and reservoir
            self.series[label] = {
                "schedule": ReplaySchedule(len(self.timing_sets)) if len(self.timing_sets) > 1 else None,
                "keep": _Reservoir(_REVALIDATED_CALLS) if msg.get("revalidate") else None}
        series = self.series[label]
        keep = series["keep"]

        def make_args(i: int) -> list[Any]:
            if keep is not None:  # a call follows: the output held as the last is not, and its memory goes first
                keep.drop_last()
            return self._timing_args(i)

        try:
            if msg.get("compile"):
                if self.compiled is None:
                    self.compiled = torch.compile(self.model)
                fn = self.compiled
            with torch.no_grad():
                threads = getattr(self.backend, "threads", torch.get_num_threads)()
                timed = time_model(label, fn, make_args, self.backend, policy, schedule=series["schedule"],
                                   on_output=keep.offer if keep else None, threads=threads)
                if (odd := getattr(self.backend, "thread_warning", lambda: None)()) is not None:
                    timed.stats = timed.stats.model_copy(update={"warnings": timed.stats.warnings + (odd,)})
                saved = None
                if keep is not None and msg.get("share_outputs"):
                    from .compare import flatten_outputs

                    # Held as they are (the sampled ones were copied when kept; the last is the candidate's own
                    # buffer): the judge reads them before the candidate runs again (`op_timing_decoy` after).
                    self.shelf.clear()
                    saved = [{"call": c, "set": s, "outputs": self.shelf.put(flatten_outputs(out))}
                             for c, (s, out) in keep.items()]
                    if not self.shelf.in_place:  # the judge reads copies: the sample's memory can go now (an
                        keep.release()  # output's worth more through the server's timed calls, H100 2026-11-24)
        except BaseException as exc:  # noqa: BLE001
            return self._failure(exc, "timing")
        reply: dict[str, Any] = {"timing": timed.stats.model_dump(mode="json"),
                                 "samples_us": [round(x * 1e6, 4) for x in timed.samples_s], "fresh": timed.fresh,
                                 "disturbed": timed.disturbed,
                                 "integrity": self._integrity()}
        if saved is not None:
            reply["revalidation"] = saved
        return_free_memory(self.backend.device)
        return reply

    def op_anchor(self, msg: dict[str, Any]) -> dict[str, Any]:
        """`calls` calls back to back, walking through the timing sets (together larger than the caches, so a
        call's inputs are not where the last call left them; no flush, no copies), then a device sync: the server
        times this op with its own clock, N and 2N calls (`kforge.tools.profile._wall_anchor`)."""
        import torch

        calls = int(msg["calls"])
        if calls:
            sets = self.timing_sets
            try:
                with torch.no_grad():
                    for i in range(calls):
                        self.model(*sets[i % len(sets)])
                    self.backend.synchronize()
            except BaseException as exc:  # noqa: BLE001
                return self._failure(exc, "timing")
        return {"calls": calls}

    def op_timing_decoy(self, msg: dict[str, Any]) -> dict[str, Any]:
        """`_decoy_record` on timing set 0 itself, the tensors the timed calls saw (run after the judge read
        the timed outputs)."""
        record = self._decoy_record(self.timing_sets[0], msg["shift"], "timing")
        return_free_memory(self.backend.device)  # the first of its two calls' outputs
        return {**record, "call": -1, "set": 0}

    def _timing_args(self, i: int) -> list[Any]:
        import torch

        raw = self.timing_sets[i % len(self.timing_sets)]
        if not self.copy_timing_inputs:
            return list(raw)
        return [a.clone() if isinstance(a, torch.Tensor) else a for a in raw]

    def op_profile(self, msg: dict[str, Any]) -> dict[str, Any]:
        import torch

        from kforge.profilers.perf_counters import PerfStat
        from kforge.profilers.torch_profiler import collect_op_table, label_extension_functions

        trace = Path(msg["artifacts"]) / "trace.json"
        try:
            with torch.no_grad(), label_extension_functions(self.extensions):
                rows, total_us, basis = collect_op_table(self.model, self._timing_args, self.backend,
                                                         calls=msg["calls"], trace_path=trace,
                                                         custom_kernels=self.kernel_names)
            perf, i = None, 0
            if msg.get("perf"):  # only where perf is the device's counter profiler (CPUs)
                with torch.no_grad(), PerfStat() as perf:
                    t_end = time.perf_counter() + msg.get("perf_seconds", 0.5)
                    while time.perf_counter() < t_end:
                        self.model(*self._timing_args(i))
                        i += 1
                    self.backend.synchronize()
        except BaseException as exc:  # noqa: BLE001
            return self._failure(exc, "profile")
        return {"rows": [r.model_dump(mode="json") for r in rows], "total_us": total_us, "basis": basis,
                "trace": trace.name if trace.exists() else None,
                "counters": [c.model_dump(mode="json") for c in perf.counters] if perf else [],
                "counters_note": perf.note if perf else None,
                "perf_calls": i, "facts": self.backend.facts().model_dump(mode="json")}


class _Reservoir:
    """A uniform random sample of k timed calls (secret: drawn with `secrets`), plus always the last.

    Kept across a series' rounds; the last call's output is held by reference, so nothing may call the
    model between the last timed call and the encoding of the sample (see `op_time`). The k copies' memory is
    taken once, at the first call, and reused by every later copy: copies that allocated as the sample filled
    and changed grew and trimmed the CPU heap, so a later timed call's output landed on new pages and paid
    their faults inside its window (issue 16)."""

    def __init__(self, k: int) -> None:
        self.k, self.seen = k, 0
        self.kept: dict[int, Any] = {}
        self.free: list[list[Any]] = []  # copies' buffers not holding a kept call
        self.last: tuple[int, Any] | None = None

    def offer(self, set_index: int, out: Any) -> None:
        import torch

        from .compare import flatten_outputs

        outputs = flatten_outputs(out)
        if self.seen == 0:  # keep only as many copies as fit in _KEPT_OUTPUT_BYTES (outputs larger: only the last)
            size = sum(o.numel() * o.element_size() for o in outputs if type(o) is torch.Tensor)
            self.k = min(self.k, _KEPT_OUTPUT_BYTES // max(1, size))
            self.free = [[torch.empty_like(o) if type(o) is torch.Tensor else o for o in outputs]
                         for _ in range(self.k)]
        call = self.seen
        self.seen += 1
        self.last = (call, (set_index, out))  # no later call runs before the sample is saved: no copy needed
        if self.k == 0:
            return
        slot = len(self.kept) if len(self.kept) < self.k else secrets.randbelow(self.seen)
        if slot < self.k:
            if len(self.kept) >= self.k:
                self.free.append(self.kept.pop(sorted(self.kept)[slot])[1])
            # Copied now: a candidate may reuse its output buffer on the next call.
            self.kept[call] = (set_index, _copy_into(self.free.pop() if self.free else None, outputs))

    def drop_last(self) -> None:
        self.last = None

    def release(self) -> None:
        """Let go of every held output and buffer (after the sample was saved as copies)."""
        self.last, self.kept, self.free = None, {}, []

    def items(self) -> list[tuple[int, Any]]:
        items = dict(self.kept)
        if self.last is not None:
            items[self.last[0]] = self.last[1]
        return sorted(items.items())


def _copy_into(buffers: list[Any] | None, outputs: list[Any]) -> list[Any]:
    """Copies of `outputs`, written into `buffers` where they match them tensor for tensor (same shape, dtype,
    device, layout), else newly allocated."""
    import torch

    def fits(b: Any, o: Any) -> bool:
        return (type(b) is torch.Tensor and b.shape == o.shape and b.dtype == o.dtype and b.device == o.device
                and b.layout == o.layout == torch.strided)

    if buffers is not None and len(buffers) == len(outputs) and all(
            fits(b, o) for b, o in zip(buffers, outputs) if type(o) is torch.Tensor):
        return [b.copy_(o.detach()) if type(o) is torch.Tensor else o for b, o in zip(buffers, outputs)]
    return [o.detach().clone() if type(o) is torch.Tensor else o for o in outputs]


def _copy_weights(model: Any, reference_state: dict[str, Any]) -> dict[str, Any]:
    """Give ModelNew the reference's initial parameters and buffers, matched by name and shape."""
    import torch

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
