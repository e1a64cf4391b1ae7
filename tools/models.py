"""Result models of the tools. Every tool returns one of these; `__str__` is its human summary.

A candidate's failure (syntax error, build error, wrong output, crash, timeout) is a normal result
with `ok=False` and a `Failure` that says what and where; only requests the server cannot serve
are errors.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kforge.backends.base import GpuInfo
from kforge.backends.build.models import BuildInfo, CompilerReport, Diagnostic, KernelResources
from kforge.profilers.report import (Baseline, Counter, OpRow, ProfileReport, TimingStats, format_us, hottest_kernel,
                                     host_paced_reason)

__all__ = [
    "KernelResources", "BuildInfo", "Check", "CompileResult", "Diagnostic", "Failure", "JobSpec", "Mismatch", "OutputCheck",
    "ProfileResult", "TensorInfo", "Tolerance", "TrialReport", "VerifyResult", "WeightSync",
    # re-exported for callers that only import tools
    "Baseline", "Counter", "OpRow", "ProfileReport", "TimingStats",
]

_FROZEN = ConfigDict(frozen=True)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


_STORED_AT = Field(default=None, description="When the stored answer was computed (Unix time); set with from_store.")


def _age(seconds: float) -> str:
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            n = seconds / size
            return f"{n:.0f} {unit}{'s' if unit == 'day' and round(n) != 1 else ''}"
    return f"{max(0.0, seconds):.0f} s"


def store_note(stored_at: float | None, took_s: float, run_again: str) -> str:
    """The line that says an answer came from the result store, not from a run now."""
    if stored_at is None:
        when = "an earlier run"
    else:
        when = (f"the run of {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(stored_at))} "
                f"({_age(time.time() - stored_at)} ago)")
    return (f"Answered from the result store, not run now: {when}, which took {took_s:.1f} s. "
            f"Pass use_store=false to {run_again}.")


# Failure kinds the candidate's own code causes: fix the code where the failure points.
_CODE_FAILURES = frozenset({"syntax_error", "import_error", "build_error", "interface_error", "exception"})
# Checks that run the candidate again on inputs like the trials' (a repeat after NaN-poisoning, the in-place
# decoy, re-validated timed calls): once the trials' outputs are wrong these fail for the same reason.
_RERUN_CHECKS = frozenset({"deterministic", "probe_memo", "timed_outputs"})
# Reduced precision (tf32, fp16, bf16) errs by about 1e-3 to 1e-2 relative; an error far above this is a
# wrong result, and the hint that reduced precision explains it is noise.
_REDUCED_PRECISION_MAX_REL = 0.05
_PRECISION_HINT = re.compile(r"relative L2 error (?P<rel>[-+0-9.e]+) exceeds(?P<rest>[^()]*?)"
                             r" \(reduced-precision arithmetic\?[^)]*\)")
_TRIAL_LIST = re.compile(r"trial\(s\) \[([0-9, ]*)\]")


def plausible_hints(text: str) -> str:
    """`text` without the reduced-precision hint where the relative error is too large for it to explain."""
    def keep_or_drop(m: re.Match[str]) -> str:
        try:
            too_large = float(m["rel"]) > _REDUCED_PRECISION_MAX_REL
        except ValueError:
            return m[0]
        return f"relative L2 error {m['rel']} exceeds{m['rest']}" if too_large else m[0]
    return _PRECISION_HINT.sub(keep_or_drop, text)


def failure_next_step(failure: Failure, tool: str) -> str:
    """The one thing to do about a failed run, and the call that follows it."""
    again = f"then call {tool} again"
    if failure.stage == "reference":
        return f"Next: fix the reference (it failed by itself, before the candidate was judged), {again}."
    where = f"line {failure.line}" if failure.line else "the error above"
    steps = {
        "timeout": f"make the candidate finish sooner (an endless loop or a wait on work that never comes?), {again}",
        "out_of_memory": f"allocate less (outputs and buffers of the reference's size, freed each call), {again}",
        "tampering": f"remove the code that changes the harness (timers, synchronize, comparisons), {again}",
    }
    if failure.kind in _CODE_FAILURES:
        return f"Next: fix {where}, {again}."
    if failure.kind in steps:
        return f"Next: {steps[failure.kind]}."
    # crashed, exited, device_fault: the candidate's process died; its output tail says where
    return (f"Next: find the out-of-bounds access or exit in the candidate (see the output tail in `failure`), "
            f"{again}.")


def split_consequences(checks: list[Check], wrong_trials: set[int] | None) -> tuple[list[Check], list[Check]]:
    """Failed checks that are findings of their own, and those that only follow from wrong outputs.

    `wrong_trials`: the trials whose outputs were wrong (None: the output was not right, trial unknown);
    empty when every output matched, so nothing follows from it.
    """
    failed = [c for c in checks if c.status == "fail"]
    if wrong_trials is not None and not wrong_trials:
        return failed, []
    findings, consequences = [], []
    for c in failed:
        follows = c.name in _RERUN_CHECKS
        named = _TRIAL_LIST.search(c.evidence)
        if follows and named and wrong_trials is not None:  # a rerun fails as a consequence only where the trial did
            follows = {int(i) for i in named[1].split(",") if i.strip()} <= wrong_trials
        (consequences if follows else findings).append(c)
    return findings, consequences


def _consequence_line(consequences: list[Check]) -> list[str]:
    if not consequences:
        return []
    return [f"  also failed, as a consequence of the wrong output (not separate findings): "
            f"{', '.join(c.name for c in consequences)}"]


class JobSpec(BaseModel):
    """What was asked: a result always carries the spec that produced it; its key indexes the store."""

    model_config = _FROZEN

    tool: str
    backend: str
    candidate_sha256: str
    reference_sha256: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, str] = Field(default_factory=dict, description="kforge and toolchain versions.")
    gpu: GpuInfo | None = Field(default=None, description="The GPU this ran on (none on a CPU backend); a stored "
                                "answer names the GPU that computed it.")

    @property
    def where(self) -> str:
        """' on GPU <index> (<name>)' where the job ran on a GPU, for the texts (several GPUs: which one); else ''."""
        return f" on GPU {self.gpu.index} ({self.gpu.name})" if self.gpu is not None else ""

    @property
    def key(self) -> str:
        # Not keyed by the GPU: a verdict holds on every GPU of the model the environment names (a profile's
        # reused baselines are keyed by the GPU itself: `kforge.tools.profile`).
        return sha256_text(json.dumps(self.model_dump(mode="json", exclude={"gpu"}), sort_keys=True))


FailureKind = Literal[
    "syntax_error", "import_error", "build_error", "interface_error", "exception",
    "timeout", "crashed", "exited", "out_of_memory", "device_fault", "tampering", "resource_limit",
]


class Failure(BaseModel):
    """What went wrong in a worker, and where."""

    model_config = _FROZEN

    stage: str = Field(description="What the worker was doing: load, build, init, forward, reference, timing, profile.")
    kind: FailureKind
    message: str
    line: int | None = Field(default=None, description="Line in the candidate (or reference) text, where known.")
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    traceback_tail: str | None = None
    output_tail: str | None = Field(default=None, description="Last lines the process printed (stdout and stderr).")

    def __str__(self) -> str:
        where = f" at line {self.line}" if self.line else ""
        return f"{self.kind} during {self.stage}{where}: {self.message}"


class CompileResult(BaseModel):
    model_config = _FROZEN

    spec: JobSpec
    ok: bool
    build_seconds: float = Field(description="Wall time of all load_inline builds.")
    load_seconds: float = Field(description="Wall time to import the candidate, builds included.")
    from_cache: bool = Field(description="True when every build was reused from the build cache.")
    builds: list[BuildInfo] = Field(default_factory=list)
    jit_kernels: list[KernelResources] = Field(
        default_factory=list, description="Kernels compiled at their first launch (Triton), with registers, shared "
        "memory, local memory, num_warps and num_stages; known once the candidate has run (give compile_kernel a "
        "reference or problem, or read verify_against_reference's compile section).")
    diagnostics: list[Diagnostic] = Field(default_factory=list, description="Errors first, then warnings.")
    failure: Failure | None = None
    from_store: bool = Field(default=False, description="True when this answer was read from the result store.")
    stored_at: float | None = _STORED_AT

    def __str__(self) -> str:
        warns = sum(d.severity == "warning" for d in self.diagnostics)
        stored = [store_note(self.stored_at, self.load_seconds, "build it again")] if self.from_store else []
        if self.ok:
            if self.from_store:  # nothing was built now: no "fresh build", no build time of this call
                lines = [f"Built OK (stored answer, nothing built now): {len(self.builds)} extension(s), "
                         f"{warns} warning(s)."] + stored
            else:
                cache = "from cache" if self.from_cache else "fresh build"
                lines = [f"Built OK ({cache}): {len(self.builds)} extension(s) in {self.build_seconds:.1f} s, "
                         f"{warns} warning(s)."]
            lines += [f"  {k}" for b in self.builds for k in b.kernels] + [f"  {k}" for k in self.jit_kernels]
            lines += [f"  vectorizer: {b.compiler_report}" for b in self.builds if b.compiler_report]
            if not self.builds and not self.jit_kernels:
                lines.append("  No load_inline builds. Kernels compiled at first launch (Triton) are reported when the "
                             "candidate runs: pass problem= or reference_code= to launch it once here.")
            lines.append("Next: verify_against_reference.")
            return "\n".join(lines)
        lines = [f"Compile failed: {self.failure}"] + stored
        lines += [f"  {d}" for d in self.diagnostics if d.severity == "error"][:5]
        if self.failure is not None:
            lines.append(failure_next_step(self.failure, "compile_kernel"))
        return "\n".join(lines)


class TensorInfo(BaseModel):
    model_config = _FROZEN

    kind: str = Field(description="'tensor' or the Python type name of a non-tensor output.")
    shape: list[int] | None = None
    dtype: str | None = None
    device: str | None = None


class Mismatch(BaseModel):
    model_config = _FROZEN

    index: list[int]
    got: float
    expected: float


class Tolerance(BaseModel):
    model_config = _FROZEN

    dtype: str
    atol: float
    rtol: float
    why: str
    precision: str = Field(default="strict", description="The precision policy the tolerance follows.")
    rel_error_bound: float | None = Field(
        default=None, description="Largest allowed relative L2 error ||got - exact|| / ||exact||, exact being the "
        "reference in float64 where it runs in float64.")
    bound_why: str | None = None


class OutputCheck(BaseModel):
    """The comparison of one output tensor of one trial."""

    model_config = _FROZEN

    output: int = Field(description="Position of the output (0 for a single tensor).")
    correct: bool
    expected: TensorInfo
    got: TensorInfo | None
    problems: list[str] = Field(default_factory=list, description="Why it is wrong, in words.")
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    mismatches: int = 0
    numel: int = 0
    first_mismatches: list[Mismatch] = Field(default_factory=list)
    nan_count: int = 0
    inf_count: int = 0
    rel_error: float | None = Field(default=None, description="Relative L2 error of the output (see tolerance.rel_error_bound).")
    reference_rel_error: float | None = Field(default=None, description="The reference's own relative L2 error "
                                              "against its float64 evaluation: the noise floor of this problem.")
    tolerance: Tolerance | None = None


class Check(BaseModel):
    """One check behind a verdict, with its evidence."""

    model_config = _FROZEN

    name: str
    status: Literal["pass", "fail", "warn", "skip"]
    hard: bool = Field(description="A failed hard check makes the verdict wrong; a soft one is a flag to read.")
    evidence: str

    def __str__(self) -> str:
        return f"[{self.status}] {self.name}: {self.evidence}"


class TrialReport(BaseModel):
    model_config = _FROZEN

    trial: int
    seed: int
    correct: bool
    distribution: str = Field(default="native", description="How the inputs were drawn: the reference's get_inputs() "
                              "('native') or a zero-mean / rescaled version of them.")
    outputs: list[OutputCheck]
    error: str | None = Field(default=None, description="Why the candidate produced no output for this trial.")


class WeightSync(BaseModel):
    """How the reference's initial weights were given to ModelNew."""

    model_config = _FROZEN

    copied: int = Field(description="Parameters and buffers copied from Model by name and shape.")
    reference_total: int
    unmatched: list[str] = Field(default_factory=list, description="Reference entries with no same-named, same-shaped entry in ModelNew.")


class VerifyResult(BaseModel):
    model_config = _FROZEN

    spec: JobSpec
    ok: bool = Field(description="True when the candidate ran; see `correct` for the verdict.")
    correct: bool
    trials: list[TrialReport] = Field(default_factory=list)
    tolerances: list[Tolerance] = Field(default_factory=list)
    weights: WeightSync | None = None
    compile: CompileResult | None = None
    checks: list[Check] = Field(default_factory=list, description="Every check behind the verdict; `correct` is true "
                                "only when no hard check failed.")
    precision: str = "strict"
    failure: Failure | None = None
    warnings: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    from_store: bool = Field(default=False, description="True when this answer was read from the result store.")
    stored_at: float | None = _STORED_AT

    def __str__(self) -> str:
        return self.summary()

    def summary(self, *, timing_here: bool = True, why_not_timed: str = "") -> str:
        """The verdict in a few lines, ending with the one next step that works on this host.

        Args:
            timing_here: whether this host can time the backend (False: Triton in its interpreter on a host
                without a GPU), so profile_kernel is no next step here.
            why_not_timed: the backend's own reason, said when `timing_here` is False.
        """
        stored = [store_note(self.stored_at, self.seconds, "verify it again")] if self.from_store else []
        if self.failure is not None:
            lines = [f"Not verified: {self.failure}"] + stored
            lines += [f"  {c}" for c in self.checks if c.status == "fail"]
            return "\n".join(lines + [failure_next_step(self.failure, "verify_against_reference")])
        passed = sum(t.correct for t in self.trials)
        head = (f"{'CORRECT' if self.correct else 'WRONG'}: {passed}/{len(self.trials)} trials passed{self.spec.where} "
                f"({'stored answer' if self.from_store else f'{self.seconds:.1f} s'}).")
        wrong = {t.trial for t in self.trials if not t.correct}
        findings, consequences = split_consequences(self.checks, wrong)
        lines = [head] + stored + [f"  {plausible_hints(str(c))}" for c in findings]
        lines += _consequence_line(consequences) + [f"  {c}" for c in self.checks if c.status == "warn"]
        lines += self._wrong_trial_lines(quoted_first=any(c.name == "outputs_match" for c in findings))
        lines += [f"  warning: {w}" for w in self.warnings]
        lines.append(self._next_step(findings, timing_here, why_not_timed))
        return "\n".join(lines)

    def _wrong_trial_lines(self, *, quoted_first: bool, most: int = 3) -> list[str]:
        """Where the first wrong trials went wrong; their problems in words only where not said already
        (`quoted_first`: the outputs_match check quoted the first wrong trial's)."""
        lines: list[str] = []
        said: set[str] = set()
        for t in (t for t in self.trials if not t.correct):
            if len(lines) >= most:
                break
            if t.error:
                lines.append(f"  trial {t.trial}: {t.error}")
                continue
            for o in (o for o in t.outputs if not o.correct):
                first = o.first_mismatches[0] if o.first_mismatches else None
                at = f"first wrong at {first.index}: got {first.got:.6g}, expected {first.expected:.6g}" if first else ""
                words = plausible_hints("; ".join(o.problems))
                shape = re.sub(r"[-+]?\d[\d.e+-]*", "#", words)
                told = shape in said or not words or (quoted_first and not lines)
                said.add(shape)
                lines.append(f"  trial {t.trial} ({t.distribution}) output {o.output}: "
                             + "; ".join(x for x in ("" if told and at else words, at) if x))
        return lines

    def _next_step(self, findings: list[Check], timing_here: bool, why_not_timed: str) -> str:
        if not self.correct:
            if any(c.name == "outputs_match" for c in findings):
                return "Next: fix the output where it first goes wrong (above), then call verify_against_reference again."
            names = ", ".join(c.name for c in findings) or "the check above"
            return f"Next: change what {names} found, then call verify_against_reference again."
        if not timing_here:
            why = f" ({why_not_timed})" if why_not_timed else ""
            return (f"Next: nothing more on this host, which cannot time {self.spec.backend}{why}: call profile_kernel "
                    f"with this candidate on a host whose list_backends shows {self.spec.backend} with timing.")
        return "Next: profile_kernel to time it against eager and torch.compile."


class ProfileResult(BaseModel):
    model_config = _FROZEN

    spec: JobSpec
    ok: bool
    profile_id: str | None = Field(default=None, description="Read it as resource kforge://profiles/{profile_id} or pass it to summarize_profile.")
    report: ProfileReport | None = None
    output_correct: bool | None = Field(default=None, description="Whether the timed candidate's output matched the reference.")
    output_check: OutputCheck | None = None
    checks: list[Check] = Field(default_factory=list, description="Checks of the timing's integrity, with evidence.")
    speedup_trusted: bool | None = Field(default=None, description="True when the output was right and no hard "
                                         "timing check failed; otherwise read `checks` before quoting a speedup.")
    kernel_resources: list[KernelResources] = Field(
        default_factory=list, description="The candidate's kernels as the compiler built them (ptxas -v, Triton metadata).")
    compiler_reports: list[CompilerReport] = Field(
        default_factory=list, description="The C++ compiler's vectorizer reports of the candidate's builds.")
    artifacts: list[str] = Field(default_factory=list, description="Resource URIs of raw artifacts (Chrome trace, logs).")
    failure: Failure | None = None
    warnings: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    from_store: bool = Field(default=False, description="True when this answer was read from the result store.")
    stored_at: float | None = _STORED_AT

    def __str__(self) -> str:
        stored = [store_note(self.stored_at, self.seconds, "profile it again")] if self.from_store else []
        if self.failure is not None or self.report is None:
            tail = [failure_next_step(self.failure, "profile_kernel")] if self.failure is not None else []
            return "\n".join([f"Not profiled: {self.failure}"] + stored + tail)
        r = self.report
        where = self.spec.where or f" on {r.device_name}"
        lines = [f"Profile {self.profile_id}{where}:"] + stored + [f"  {r.candidate}"]
        for b in r.baselines:
            if b.timing is not None:
                reused = (f" (timed {b.reused_after_s:.0f} s ago and reused: eager still times the same; "
                          "fresh_baselines=true re-times it)") if b.reused_after_s is not None else (
                          f" (compiled and timed ahead, added {b.added_after_s:.0f} s after this profile answered: "
                          "eager there timed the same)") if b.added_after_s is not None else ""
                ci = f" [{b.speedup_ci[0]:.2f}, {b.speedup_ci[1]:.2f}], {b.comparison}" if b.speedup_ci else ""
                lines.append(f"  {b.timing}{reused}; candidate speedup x{b.speedup:.2f}{ci}")
            elif b.pending:
                lines.append(f"  {b.name}: {b.pending}")
            else:
                lines.append(f"  {b.name}: not timed ({b.error})")
        if r.host_paced:  # the reason ends with how wide the intervals were made, and why
            lines.append(f"  host-paced: {r.host_paced}")
        if r.custom_share is not None:
            lines.append(f"  candidate's own kernels: {100 * r.custom_share:.0f}% of profiled op time")
        if r.bandwidth_fraction is not None:
            lines.append(f"  moves its inputs and outputs at {r.achieved_bandwidth_gbs:.1f} GB/s, "
                         f"{100 * r.bandwidth_fraction:.1f}% of the measured {r.device.peak_bandwidth_gbs:g} GB/s")
        if r.compute_fraction is not None:
            lines.append(f"  {r.achieved_tflops:.3g} TFLOP/s, {100 * r.compute_fraction:.1f}% of the measured matmul rate")
        if (k := hottest_kernel(r.ncu)) is not None:
            m = k.metrics
            stall = f"; top stall {k.top_stalls[0][0]}" if k.top_stalls else ""
            lines.append(f"  ncu {k.name.split('(')[0]}: {m.get('Duration [us]', 0):.2f} us, SM {m.get('Compute (SM) Throughput', 0):.0f}%, "
                         f"memory {m.get('Memory Throughput', 0):.0f}%, occupancy {m.get('Achieved Occupancy', 0):.0f}%"
                         f" (limited by {k.occupancy_limiter}){stall}")
        elif r.counters_note:
            lines.append(f"  hardware counters: {r.counters_note}")
        if self.output_correct is False:
            lines.append("  WARNING: the timed output did not match the reference; speedups are meaningless")
        findings, consequences = split_consequences(self.checks, None if self.output_correct is False else set())
        lines += [f"  {c}" for c in findings] + _consequence_line(consequences)
        lines += [f"  {c}" for c in self.checks if c.status == "warn"]
        if self.speedup_trusted is False:
            lines.append("  SPEEDUP NOT TRUSTED: see the failed checks above")
        lines += [f"  warning: {w}" for w in self.warnings if not (self.output_correct is False and "fix correctness" in w)]
        lines.append(self._next_step(findings))
        return "\n".join(lines)

    def _next_step(self, findings: list[Check]) -> str:
        if self.output_correct is False:
            return "Next: verify_against_reference to see where the output goes wrong, and fix it before timing again."
        if findings and all(c.name == "stable_timing" for c in findings) and host_paced_reason(self.report):
            return ("Next: make each call launch fewer kernels (fuse them, or a library algorithm that launches fewer) "
                    "or capture it in a CUDA graph, then profile_kernel again: a longer budget_s does not steady a "
                    "call that runs at the host's pace.")
        if findings and all(c.name == "stable_timing" for c in findings):
            budget = float(self.spec.options.get("budget_s") or 2.0)
            return (f"Next: profile_kernel again with budget_s={min(60.0, 2 * budget):g} on an idle machine: these "
                    "speedups are too noisy to quote.")
        if findings:
            return f"Next: change what {', '.join(c.name for c in findings)} found, then profile_kernel again."
        return f"Next: summarize_profile with profile_id='{self.profile_id}' for the bottleneck and what to change."


def speedup_line(base: Baseline) -> str:
    if base.timing is None:
        return f"{base.name}: n/a"
    return f"{base.name} {format_us(base.timing.median_us)} (x{base.speedup:.2f})"
