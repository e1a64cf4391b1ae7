"""Timing inside a worker, for both roles: the judge times the baselines (eager, torch.compile) on the reference,
the candidate's worker times ModelNew, each on timing inputs it made from the server's seeds.

A `Bench` holds the timing sets and each series' replay schedule and reservoir of kept outputs; its owner (the
`Judge` or the `Candidate`) hands it the model to time.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..process.protocol import PaceReply, PaceRequest, PrecompileReply, TimeReply, TimeRequest, TimingSetsReply
from .compare import flatten_outputs
from .handoff import return_free_memory
from .inputs import seeded_inputs
from .session import Session
from .timing import ReplaySchedule, TimingPolicy, time_model

__all__ = ["Bench"]

_REVALIDATED_CALLS = 8  # timed outputs kept (a secret reservoir sample) for the judge, plus the last ...
_KEPT_OUTPUT_BYTES = 512 * 2**20  # ... as many of them as fit in this many bytes of device memory
_COPIED_SET_BYTES = 256 * 2**20  # timing input sets up to this size get a fresh copy per timed call


@dataclass
class Bench:
    session: Session
    timing_sets: list[list[Any]] = field(default_factory=list)
    copy_timing_inputs: bool = True
    series: dict[str, dict[str, Any]] = field(default_factory=dict)  # per timed series: replay schedule, kept outputs
    compiled: Any = None  # torch.compile of the model, made at its first timed round

    def make_sets(self, source: Any, seeds: list[int]) -> TimingSetsReply:
        """Make the timing inputs on the device from the server's seeds (the judge and the candidate's
        process each make their own, bit-identical; nothing goes through a file). `source`: the module whose
        `get_inputs` makes them."""
        backend = self.session.backend
        try:
            self.timing_sets = [seeded_inputs(source, seed, backend) for seed in seeds]
        except BaseException as exc:  # noqa: BLE001
            return TimingSetsReply(failure=self.session.failure(exc, "reference"))
        return_free_memory(backend)
        set_bytes = sum(a.numel() * a.element_size() for a in self.timing_sets[0] if isinstance(a, torch.Tensor))
        # A fresh copy per call keeps a candidate that writes into its inputs from changing the sets; for
        # sets too large to copy twice over, the sets are used as they are (verify checks input writes).
        self.copy_timing_inputs = set_bytes <= _COPIED_SET_BYTES
        return TimingSetsReply(count=len(self.timing_sets), set_bytes=set_bytes)

    def timing_args(self, i: int) -> list[Any]:
        raw = self.timing_sets[i % len(self.timing_sets)]
        if not self.copy_timing_inputs:
            return list(raw)
        return [a.clone() if isinstance(a, torch.Tensor) else a for a in raw]

    def release_kept(self) -> None:
        """Let go of the timed outputs kept for the judge (it has read them)."""
        for series in self.series.values():
            series["keep"] = None

    def time(self, req: TimeRequest, model: Any) -> TimeReply:
        """Time one round of one series ('candidate', 'eager', 'torch.compile'); the server interleaves rounds
        of the series so drift between them shows in the speedup's interval instead of biasing it."""
        backend, shelf = self.session.backend, self.session.shelf
        label = req.label
        policy = TimingPolicy(**req.policy)
        fn: Callable[..., Any] = model
        if label in self.series:
            # A later round: the first one compiled, autotuned and grew the allocator in this process; one call and
            # the estimate's three settle the clocks (3 calls of a 17 ms convolution were 51 ms a round).
            policy.warmup_calls = min(policy.warmup_calls, 1)
        else:  # the first round of this series: its replay schedule and reservoir
            self.series[label] = {
                "schedule": ReplaySchedule(len(self.timing_sets)) if len(self.timing_sets) > 1 else None,
                "keep": _Reservoir(_REVALIDATED_CALLS) if req.revalidate else None}
        series = self.series[label]
        keep = series["keep"]

        def make_args(i: int) -> list[Any]:
            if keep is not None:  # a call follows: the output held as the last is not, and its memory goes first
                keep.drop_last()
            return self.timing_args(i)

        try:
            if req.compile:
                if self.compiled is None:
                    self.compiled = torch.compile(model)
                fn = self.compiled
            with torch.no_grad():
                threads = getattr(backend, "threads", torch.get_num_threads)()
                timed = time_model(label, fn, make_args, backend, policy, schedule=series["schedule"],
                                   on_output=keep.offer if keep else None, threads=threads)
                if (odd := getattr(backend, "thread_warning", lambda: None)()) is not None:
                    timed.stats = timed.stats.model_copy(update={"warnings": timed.stats.warnings + (odd,)})
                saved = None
                if keep is not None and req.share_outputs:
                    # Held as they are (the sampled ones were copied when kept; the last is the candidate's own
                    # buffer): the judge reads them before the candidate runs again (`timing_decoy` after).
                    shelf.clear()
                    saved = [{"call": c, "set": s, "outputs": shelf.put(flatten_outputs(out))}
                             for c, (s, out) in keep.items()]
                    if not shelf.in_place:  # the judge reads copies: the sample's memory can go now (an
                        keep.release()  # output's worth more through the server's timed calls, H100 2026-11-24)
        except BaseException as exc:  # noqa: BLE001
            return TimeReply(failure=self.session.failure(exc, "timing"))
        reply = TimeReply(timing=timed.stats, samples_us=[round(x * 1e6, 4) for x in timed.samples_s],
                          fresh=timed.fresh, disturbed=timed.disturbed, integrity=self.session.integrity(),
                          revalidation=saved)
        return_free_memory(backend)
        return reply

    def precompile(self, model: Any) -> PrecompileReply:
        """torch.compile of `model`, made as `time` makes it, and called once on the first timing set with its first
        graph held back at its first run: Dynamo traces and Inductor compiles (host work: fake tensors, code
        generation, Triton's compiler), and no kernel of the model runs. Dynamo keeps the compiled graph, so the
        torch.compile series' first round runs it without compiling. A graph break's later graphs compile there."""
        import torch._inductor.compile_fx as inductor

        if not self.timing_sets:
            return PrecompileReply(failure=self.session.failure(
                RuntimeError("no timing sets: make them before precompiling"), "timing"))
        compile_fx, held = inductor.compile_fx, [True]

        def compile_then_hold(*args: Any, **kwargs: Any) -> Any:
            return _HeldAtFirstRun(compile_fx(*args, **kwargs), held)

        try:
            if self.compiled is None:
                self.compiled = torch.compile(model)
            inductor.compile_fx = compile_then_hold  # what torch.compile's Inductor backend looks up at each compile
            try:
                with torch.no_grad():  # the set itself, not a copy: a copy is a kernel, and none runs
                    self.compiled(*self.timing_sets[0])
            finally:
                inductor.compile_fx = compile_fx
        except _CompiledNotRun:
            return PrecompileReply(compiled=True)
        except BaseException as exc:  # noqa: BLE001
            return PrecompileReply(failure=self.session.failure(exc, "timing"))
        finally:
            return_free_memory(self.session.backend)
        return PrecompileReply(compiled=False)

    def pace(self, req: PaceRequest, model: Any) -> PaceReply:
        """`req.calls` calls of a series timed in this job under torch.profiler, on its timing sets: the launches
        and the device's busy time that say whether its call runs at the host's pace. torch.compile only once its
        rounds compiled it here (a reused baseline's pace travels with its stored timing instead)."""
        from kforge.profilers.torch_profiler import collect_op_table

        backend = self.session.backend
        if getattr(backend, "kind", "cpu") != "gpu" or len(backend.profiler_activities()) < 2:
            return PaceReply(launches=0, device_us=None)  # calls run as they are made: no device to idle
        fn = self.compiled if req.label == "torch.compile" else model
        if fn is None or not self.timing_sets:
            return PaceReply(failure=self.session.failure(
                RuntimeError(f"{req.label} was not timed in this job: no pace to read"), "timing"))
        try:
            with torch.no_grad():
                table = collect_op_table(fn, self.timing_args, backend, calls=req.calls, trace_path=None)
        except BaseException as exc:  # noqa: BLE001
            return PaceReply(failure=self.session.failure(exc, "timing"))
        finally:
            return_free_memory(backend)
        return PaceReply(launches=table.device_launches, host_launches=table.host_launches,
                         device_us=table.total_us if table.basis == "device" and table.rows else None)


class _CompiledNotRun(Exception):
    """Raised in place of a precompiled graph's first run (`Bench.precompile`)."""


class _HeldAtFirstRun:
    """A compiled graph whose first run raises `_CompiledNotRun` while `held` holds (once, for all of a model's graphs),
    and which runs as the graph itself after that. Dynamo calls a boxed graph (`_boxed_call`) with one list. It stays
    in the compiled baseline's path: one Python call more per graph call (~0.1-0.2 us on a call whose host path is
    tens of microseconds)."""

    def __init__(self, graph: Any, held: list[bool]) -> None:
        self._graph, self._held = graph, held
        self._boxed_call = getattr(graph, "_boxed_call", False)

    def __call__(self, *args: Any) -> Any:
        if self._held:
            self._held.clear()
            raise _CompiledNotRun
        return self._graph(*args)

    def __getattr__(self, name: str) -> Any:  # what Dynamo or AOTAutograd read of the graph (its metadata)
        return getattr(self._graph, name)


class _Reservoir:
    """A uniform random sample of k timed calls (secret: drawn with `secrets`), plus always the last.

    Kept across a series' rounds; the last call's output is held by reference, so nothing may call the
    model between the last timed call and the encoding of the sample (see `Bench.time`). The k copies' memory is
    taken once, at the first call, and reused by every later copy: copies that allocated as the sample filled
    and changed grew and trimmed the CPU heap, so a later timed call's output landed on new pages and paid
    their faults inside its window (issue 16)."""

    def __init__(self, k: int) -> None:
        self.k, self.seen = k, 0
        self.kept: dict[int, Any] = {}
        self.free: list[list[Any]] = []  # copies' buffers not holding a kept call
        self.last: tuple[int, Any] | None = None

    def offer(self, set_index: int, out: Any) -> None:
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
    def fits(b: Any, o: Any) -> bool:
        return (type(b) is torch.Tensor and b.shape == o.shape and b.dtype == o.dtype and b.device == o.device
                and b.layout == o.layout == torch.strided)

    if buffers is not None and len(buffers) == len(outputs) and all(
            fits(b, o) for b, o in zip(buffers, outputs) if type(o) is torch.Tensor):
        return [b.copy_(o.detach()) if type(o) is torch.Tensor else o for b, o in zip(buffers, outputs)]
    return [o.detach().clone() if type(o) is torch.Tensor else o for o in outputs]
