"""The worker protocol: one request model and one reply model per op, used by the server and the worker alike.

The server sends a request (`WorkerProcess.call`), the worker finds the op's handler through `REQUESTS` and
answers with the request's reply model (`Request.reply`). On the wire both are JSON objects, one a line
(`kforge.tools.process.channel`); the request names its op (`op`), and an envelope travels beside the fields:
the call's `nonce`, and from the worker `ok`, `device_peak_bytes`, `trace_parts`, or `fatal` and `traceback`
when the harness itself failed. An op's failure that the user can act on is a `Failure` in the reply (every
reply may carry one: a candidate that takes every file descriptor fails any op); fields marked `on_success`
must then be present only when there is no failure.

Server-safe: pydantic and result models only, never torch.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kforge.backends.base import Availability, DeviceFacts
from kforge.profilers.report import NcuKernel
from kforge.tools.models import (BuildInfo, Counter, Diagnostic, Failure, KernelResources, OpRow, OutputCheck,
                                 TensorInfo, TimingStats, WeightSync)

__all__ = ["REQUESTS", "AnchorReply", "AnchorRequest", "CalibrateReply", "CalibrateRequest", "CeilingsReply",
           "CeilingsRequest", "CheckDecoyReply", "CheckDecoyRequest", "CheckRepeatReply", "CheckRepeatRequest",
           "CheckReply", "CheckRequest", "DecoyReply", "DecoyRequest", "DecoyVerdict", "EvidenceReply",
           "EvidenceRequest", "ExpectReply", "ExpectRequest", "Judging", "KeptOutputs", "LaunchFloorReply",
           "LaunchFloorRequest", "LoadReply", "LoadRequest", "NullOutcome", "OpReply", "OutputDescriptors",
           "PaceReply", "PaceRequest", "PrepareReply", "PrepareRequest", "ProbeReply", "ProbeRequest", "ProblemSizeReply", "ProblemSizeRequest",
           "ProfileReply", "ProfileRequest", "PrecompileReply", "PrecompileRequest", "ProtocolError", "ReadReportReply", "ReadReportRequest", "ReleaseReply",
           "ReleaseRequest", "RepeatReply", "RepeatRequest", "RepeatVerdict", "Request", "ResetReply",
           "ResetRequest", "RevalidateReply", "RevalidateRequest", "SetupReply", "SetupRequest", "TimeReply",
           "TimeRequest", "TimingDecoyReply", "TimingDecoyRequest", "TimingSetsReply", "TimingSetsRequest",
           "TrialReply", "TrialRequest", "TrialVerdict", "WorkerInit", "WorkerRole", "WrongCall",
           "parse_reply", "parse_request"]


# Unknown fields are refused; NaN and infinities cross as themselves (a candidate's NaN output is evidence), not
# as null, in open payloads too (`dict[str, Any]`: pydantic's JSON mode would make them None).
_STRICT = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class ProtocolError(ValueError):
    """A message that is not what the protocol says: an unknown op, a request or reply that does not validate."""


def on_success(default: Any = None, *, factory: Any = None) -> Any:
    """A reply field present in every reply without a failure (absent, it takes `default` when there is one)."""
    extra = {"on_success": True}
    if factory is not None:
        return Field(default_factory=factory, json_schema_extra=extra)
    return Field(default=default, json_schema_extra=extra)


class OpReply(BaseModel):
    """What every reply may carry: the op's failure (the candidate's or the reference's fault, located)."""

    model_config = _STRICT

    failure: Failure | None = None

    @model_validator(mode="after")
    def _complete(self) -> OpReply:
        if self.failure is None:
            missing = [name for name, f in type(self).model_fields.items()
                       if (f.json_schema_extra or {}).get("on_success") and name not in self.model_fields_set]
            if missing:
                raise ValueError(f"a reply without a failure must have {', '.join(missing)}")
        return self


R = TypeVar("R", bound=OpReply)

# op name -> its request model, filled as the request models are defined below.
REQUESTS: dict[str, type[Request[Any]]] = {}


class Request(BaseModel, Generic[R]):
    """One op's request. A subclass names its op (`op: Literal[...]`) and its reply (`Request[XReply]`)."""

    model_config = _STRICT

    reply: ClassVar[type[OpReply]] = OpReply

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for base in cls.__mro__:  # `Request[XReply]`: its generic argument is the reply model
            meta = getattr(base, "__pydantic_generic_metadata__", None) or {}
            if meta.get("origin") is Request and meta.get("args"):
                cls.reply = meta["args"][0]
                break
        op = cls.model_fields["op"].default if "op" in cls.model_fields else None
        if isinstance(op, str):
            REQUESTS[op] = cls


class Judging(BaseModel):
    """How the judge compares outputs (the tool's tolerances and precision)."""

    atol: float | None = None
    rtol: float | None = None
    precision: str = "strict"


OutputDescriptors = list[dict[str, Any]]  # outputs held for the judge (`kforge.tools.harness.handoff`): open by design


# -- the worker's start ------------------------------------------------------------------------------------

# A worker's role: the judge, the candidate's worker (rerun: one under a rerun profiler, `Profiler.where`), or a worker
# of the server's own (probe: which backends run here, ceilings: the device's measured ceilings).
WorkerRole = Literal["judge", "candidate", "rerun", "probe", "ceilings"]


class WorkerInit(BaseModel):
    """The first message a worker gets: its job's role, backend, directories and limits."""

    model_config = _STRICT

    role: WorkerRole
    backend: str
    scratch: str
    log: str
    cache_dir: str
    memory_bytes: int | None = None
    file_bytes: int | None = None
    precompiled_headers: bool = False
    server_builds: bool = False  # the shared cache is read-only in the worker: the server builds
    isolate_network: bool = True


# -- any role ----------------------------------------------------------------------------------------------

class ProbeReply(OpReply):
    backends: list[Availability] = on_success(factory=list)


class ProbeRequest(Request[ProbeReply]):
    """Which of `backends` can run here, and why not (a worker without a backend: it works without torch)."""
    op: Literal["probe"] = "probe"
    backends: list[str]


class CeilingsReply(OpReply):
    facts: DeviceFacts | None = on_success()
    cached: str | None = None  # where they were cached, or None ...
    to_store: dict[str, Any] | None = None  # ... and then {"name", "ceilings"} for the server to cache


class CeilingsRequest(Request[CeilingsReply]):
    """The device's facts with its measured ceilings (measured once per device, or again)."""
    op: Literal["ceilings"] = "ceilings"
    gpu: str | None = None
    remeasure: bool = False


class LoadReply(OpReply):
    seconds: float = on_success(0.0)
    builds: list[BuildInfo] = on_success(factory=list)
    pch_builds: list[tuple[str, str]] = Field(default_factory=list)  # header builds for the server to start
    kernel_names: list[str] = on_success(factory=list)
    diagnostics: list[Diagnostic] = on_success(factory=list)


class LoadRequest(Request[LoadReply]):
    """Build and import the user's module (`role`: the reference in the judge, the candidate in its worker)."""
    op: Literal["load"] = "load"
    role: Literal["reference", "candidate"]
    source: str


class ReadReportReply(OpReply):
    kernels: list[NcuKernel] = on_success(factory=list)
    note: str | None = None


class ReadReportRequest(Request[ReadReportReply]):
    """Read a rerun profiler's report, such as Nsight Compute's (in the judge: its report module is not the candidate's to run)."""
    op: Literal["read_report"] = "read_report"
    profiler: str  # the rerun profiler that wrote it (`kforge.profilers`)
    report: str
    custom_names: list[str] = Field(default_factory=list)


# -- the judge ---------------------------------------------------------------------------------------------

class ExpectReply(OpReply):
    distribution: str = on_success("native")
    note: str | None = None
    seconds: float = on_success(0.0)
    exact: bool = on_success(False)
    exact_note: str | None = None


class ExpectRequest(Request[ExpectReply]):
    """Trial i's expected outputs, kept in the judge."""
    op: Literal["expect"] = "expect"
    i: int


class PrepareReply(OpReply):
    expected: list[TensorInfo] = on_success(factory=list)
    distribution: str = on_success("native")
    note: str | None = None
    exact: bool = on_success(False)
    exact_note: str | None = None
    reference_call_s: float | None = on_success()
    footprint_bytes: int | None = on_success()
    capacity_bytes: int | None = on_success()


class PrepareRequest(Request[PrepareReply]):
    """Build Model with the weights of `init_seed` and trial 0's expected outputs."""
    op: Literal["prepare"] = "prepare"
    init_seed: int
    seeds: list[int]
    exact: bool = True
    variants: bool = True


class TrialReply(OpReply):
    """A trial's record: where the candidate's outputs are held, and the evidence beside them."""
    devices: list[str | None] = Field(default_factory=list)
    aliases: list[str] = Field(default_factory=list)
    inputs_modified: list[int] = Field(default_factory=list)
    outputs: OutputDescriptors = Field(default_factory=list)
    repeat: OutputDescriptors | None = None  # the same inputs again after the allocator was poisoned
    error: str | None = None  # the candidate's call raised (then `failure` locates it)

    @model_validator(mode="after")
    def _an_error_or_outputs(self) -> TrialReply:
        if self.error is None and self.failure is None and "outputs" not in self.model_fields_set:
            raise ValueError("a trial's record needs its outputs or an error")
        return self


class TrialRequest(Request[TrialReply]):
    """Run trial i on fresh inputs of the judge's distribution; hold the outputs for the judge."""
    op: Literal["trial"] = "trial"
    i: int
    variant: str = "native"
    repeat: bool = True
    share: bool = True


class RepeatVerdict(BaseModel):
    """Trial i run again after the allocator was poisoned with NaN: bitwise the first run's outputs, and correct."""
    model_config = _STRICT

    repeat_identical: bool
    repeat_correct: bool
    repeat_problems: list[str] = Field(default_factory=list)  # the first few, in words


class TrialVerdict(BaseModel):
    """The judge's reading of one trial (or, with `error`, the candidate's call that failed): each output's check, the
    outputs that alias inputs or each other, the inputs it wrote into, and its repeat where one ran."""
    model_config = _STRICT

    error: str | None = None
    distribution: str = "native"
    checks: list[OutputCheck] = Field(default_factory=list)
    aliases: list[str] = Field(default_factory=list)
    inputs_modified: list[int] = Field(default_factory=list)
    repeat: RepeatVerdict | None = None


class CheckReply(OpReply):
    trial: TrialVerdict | None = on_success()


class CheckRequest(Judging, Request[CheckReply]):
    """Judge trial i's record from the candidate's worker."""
    op: Literal["check"] = "check"
    i: int
    record: TrialReply
    digest: bool = False  # keep digests of the outputs: the repeat comes on its own (`check_repeat`)


class RepeatReply(OpReply):
    repeat: OutputDescriptors | None = None
    devices: list[str | None] = Field(default_factory=list)
    error: str | None = None

    @model_validator(mode="after")
    def _an_error_or_outputs(self) -> RepeatReply:
        if self.error is None and self.failure is None and self.repeat is None:
            raise ValueError("a repeat needs its outputs or an error")
        return self


class RepeatRequest(Request[RepeatReply]):
    """Trial i's inputs again after the allocator was poisoned with NaN, on its own."""
    op: Literal["repeat"] = "repeat"
    i: int


class CheckRepeatReply(OpReply):
    repeat: RepeatVerdict | None = on_success()


class CheckRepeatRequest(Judging, Request[CheckRepeatReply]):
    op: Literal["check_repeat"] = "check_repeat"
    i: int
    record: RepeatReply


class NullOutcome(BaseModel):
    """Would a trivial output (a null: zeros, a constant, ...) pass a trial's check, and its element-wise tolerance?"""
    model_config = _STRICT

    null: str
    applicable: bool = True  # False: the reference's outputs cannot take this form
    passes: bool = False
    elementwise_passes: bool = False
    note: str | None = None  # why it is not applicable


class CalibrateReply(OpReply):
    nulls: list[NullOutcome] = on_success(factory=list)


class CalibrateRequest(Judging, Request[CalibrateReply]):
    """Would trivial candidates pass trial i's check? (`nulls`: the ones still worth trying; None: all.)"""
    op: Literal["calibrate"] = "calibrate"
    i: int
    nulls: list[str] | None = None


class ProblemSizeReply(OpReply):
    problem_bytes: int = on_success(0)
    problem_flops: int | None = None
    dtype: str | None = None


class ProblemSizeRequest(Request[ProblemSizeReply]):
    """Bytes in and out of one call and its FLOPs."""
    op: Literal["problem_size"] = "problem_size"


class DecoyReply(OpReply):
    """The candidate's call on inputs changed in place where a cheap probe cannot see it."""
    decoy_shift: int
    outputs: OutputDescriptors | None = None
    error: str | None = None


class DecoyRequest(Request[DecoyReply]):
    op: Literal["decoy"] = "decoy"
    shift: int


class DecoyVerdict(BaseModel):
    """The candidate's answer on inputs changed in place where a cheap probe cannot see it (`error`: the call failed)."""
    model_config = _STRICT

    correct: bool
    problems: list[str] = Field(default_factory=list)
    error: str | None = None


class CheckDecoyReply(OpReply):
    decoy: DecoyVerdict | None = on_success()


class CheckDecoyRequest(Judging, Request[CheckDecoyReply]):
    op: Literal["check_decoy"] = "check_decoy"
    record: DecoyReply


class KeptOutputs(BaseModel):
    """Outputs of one timed call (`call`, on timing set `set`) kept for the judge; a decoy's names its shift."""
    model_config = _STRICT

    call: int
    set: int
    outputs: OutputDescriptors
    decoy_shift: int | None = None


class WrongCall(BaseModel):
    """A timed call whose kept outputs the judge found wrong on its own timing inputs."""
    model_config = _STRICT

    call: int
    problems: list[str] = Field(default_factory=list)


class RevalidateReply(OpReply):
    checked: int = on_success(0)
    wrong: list[WrongCall] = on_success(factory=list)
    decoy: DecoyVerdict | None = None


class RevalidateRequest(Judging, Request[RevalidateReply]):
    """Compare outputs kept during timing with the reference on the same timing inputs."""
    op: Literal["revalidate"] = "revalidate"
    items: list[KeptOutputs]


# -- the candidate -----------------------------------------------------------------------------------------

class SetupReply(OpReply):
    weights: WeightSync | None = on_success()


class SetupRequest(Request[SetupReply]):
    """Build ModelNew with the reference's initial weights; the trial inputs are made from the seeds."""
    op: Literal["setup"] = "setup"
    reference_source: str
    init_seed: int
    seeds: list[int]


class ReleaseReply(OpReply):
    pass


class ReleaseRequest(Request[ReleaseReply]):
    """The judge is done with the held outputs."""
    op: Literal["release"] = "release"


class EvidenceReply(OpReply):
    jit_kernels: list[KernelResources] = on_success(factory=list)
    integrity: dict[str, list[str]] | None = on_success()  # tampering, flags, background
    custom_work: dict[str, Any] | None = None


class EvidenceRequest(Request[EvidenceReply]):
    """What the verdict needs beside the outputs, gathered after the trials."""
    op: Literal["evidence"] = "evidence"
    custom_work: bool = True


# -- timing (both roles: the judge times the baselines) -----------------------------------------------------

class TimingSetsReply(OpReply):
    count: int = on_success(0)
    set_bytes: int = on_success(0)


class TimingSetsRequest(Request[TimingSetsReply]):
    """Make the timing inputs from the server's seeds (the candidate's from the reference's source)."""
    op: Literal["timing_sets"] = "timing_sets"
    seeds: list[int]
    reference_source: str | None = None


class TimeReply(OpReply):
    timing: TimingStats | None = on_success()
    samples_us: list[float] = on_success(factory=list)
    fresh: list[bool] = Field(default_factory=list)
    disturbed: list[bool] = Field(default_factory=list)
    integrity: dict[str, list[str]] | None = on_success()
    revalidation: list[KeptOutputs] | None = None


class TimeRequest(Request[TimeReply]):
    """Time one round of one series ('candidate', 'eager', 'torch.compile')."""
    op: Literal["time"] = "time"
    label: str
    compile: bool = False
    policy: dict[str, Any] = Field(default_factory=dict)  # `kforge.tools.harness.timing.TimingPolicy`'s fields
    revalidate: bool = False
    share_outputs: bool = False


class AnchorReply(OpReply):
    calls: int = on_success(0)


class AnchorRequest(Request[AnchorReply]):
    """`calls` calls back to back, timed by the server's clock."""
    op: Literal["anchor"] = "anchor"
    calls: int


class LaunchFloorReply(OpReply):
    calls: int = on_success(0)


class LaunchFloorRequest(Request[LaunchFloorReply]):
    """`calls` calls of a one-element op back to back in the judge, timed by the server's clock: the host's own
    pace of launching (`kforge.tools.profile._wall_anchor`)."""
    op: Literal["launch_floor"] = "launch_floor"
    calls: int


class PrecompileReply(OpReply):
    compiled: bool = on_success(False)  # its first graph compiled without running (False: it ran to the end)


class PrecompileRequest(Request[PrecompileReply]):
    """Compile the reference with torch.compile (Dynamo and Inductor, on the first timing set's shapes) without running
    its kernels: host work only, which may go beside another job's timing. The torch.compile series' first round then
    runs what was compiled (`kforge.tools.harness.bench.Bench.precompile`)."""
    op: Literal["precompile"] = "precompile"


class PaceReply(OpReply):
    launches: int = on_success(0)  # kernels, copies and memsets of the profiled calls
    host_launches: int = 0  # the host's calls that issued them
    device_us: float | None = None  # their durations summed; None where the profiler saw no device time (a CPU)


class PaceRequest(Request[PaceReply]):
    """torch.profiler over `calls` calls of a baseline the judge timed in this job ('eager', or 'torch.compile' once
    compiled): its device launches and busy time, which say whether the baseline's call runs at the host's pace."""
    op: Literal["pace"] = "pace"
    label: str
    calls: int


class ResetReply(OpReply):
    reserved_bytes: int = on_success(0)  # device memory its allocator still holds after the reset


class ResetRequest(Request[ResetReply]):
    """A worker kept for the next job of the same code (`WorkerPool.give_back_kept`) forgets this one, and cached
    device memory goes back to the GPU. A judge: its trials' inputs, expected outputs, timing sets, baselines and
    secret digest weights go; only its loaded reference module stays (the next job's `prepare` builds Model anew).
    A candidate: its ModelNew, inputs, timing sets and held outputs go; its loaded module (the build) stays, and the
    next job's `setup` builds ModelNew anew from that job's seeds."""
    op: Literal["reset"] = "reset"


class TimingDecoyReply(DecoyReply):
    call: int = -1
    set: int = 0


class TimingDecoyRequest(Request[TimingDecoyReply]):
    op: Literal["timing_decoy"] = "timing_decoy"
    shift: int


class ProfileReply(OpReply):
    rows: list[OpRow] = on_success(factory=list)
    total_us: float = on_success(0.0)
    basis: str = on_success("")
    device_launches: int = 0  # kernels, copies and memsets of the profiled calls
    host_launches: int = 0  # the host's calls that issued them (a CUDA graph's replay: one)
    trace: str | None = None
    counters: list[Counter] = Field(default_factory=list)
    counters_note: str | None = None
    perf_calls: int = 0
    facts: DeviceFacts | None = on_success()


class ProfileRequest(Request[ProfileReply]):
    """torch.profiler over the candidate's calls on the timing sets, and the device's in-worker counter profiler
    (`counters`, a name in `kforge.profilers`' registry: perf on CPUs) where it has one."""
    op: Literal["profile"] = "profile"
    artifacts: str
    calls: int
    counters: str | None = None
    perf_seconds: float = 0.5


# -- parsing -----------------------------------------------------------------------------------------------

def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(message)'}: {e['msg']}" for e in exc.errors()[:5])


def parse_request(msg: dict[str, Any]) -> Request[Any]:
    """The request in `msg` (its envelope already taken off), or a ProtocolError that says what is wrong."""
    op = msg.get("op")
    if op not in REQUESTS:
        raise ProtocolError(f"unknown worker op {op!r}; known: {', '.join(sorted(REQUESTS))}")
    try:
        return REQUESTS[op].model_validate(msg)
    except ValidationError as exc:
        raise ProtocolError(f"worker op {op!r}: the request does not validate: {_errors(exc)}") from None


def parse_reply(request: Request[R], reply: dict[str, Any]) -> R:
    """`reply` as the request's reply model, or a ProtocolError naming the op and what was wrong."""
    try:
        return request.reply.model_validate(reply)  # type: ignore[return-value]
    except ValidationError as exc:
        raise ProtocolError(f"worker op {request.op!r} sent a malformed reply ({request.reply.__name__}): "  # type: ignore[attr-defined]
                            f"{_errors(exc)}") from None
