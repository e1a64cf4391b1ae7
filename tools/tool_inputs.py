"""Every tool input, defined once: its type, bounds and description (here) and its default (where it is a field).

The request models (`kforge.tools.requests`) and the models below are the only declarations of what the MCP
tools accept; the server builds each tool's parameters, and so the JSON schema clients see, from their fields
(`kforge.server.tool_params`). Torch-free and light: the worker's harness imports `Precision` from here.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["BASELINES", "RequestError", "DEFAULT_BUDGET_S", "DEFAULT_WAIT_S", "PRECISIONS", "Backend", "BudgetS", "CandidateCode", "Gpu", "JobLookup",
           "Precision", "PrecisionPolicy", "ReferenceChoice", "ReferenceCode", "SummarizeInputs", "Waiting"]


class RequestError(Exception):
    """A request the server cannot serve (unknown backend, unknown profile); the message says how to fix it."""


#: The baselines a profile times beside the candidate, by default all of them.
BASELINES = ("eager", "torch.compile")

#: A declared precision policy: strict, or the lower precision the candidate says it computes in.
Precision = Literal["strict", "tf32", "fp16", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)

#: Defaults that the server's settings may replace (KFORGE_TIMING_BUDGET_S, KFORGE_JOB_WAIT_S).
DEFAULT_BUDGET_S = 1.0
DEFAULT_WAIT_S = 45.0

_REFERENCE = "Python source defining class Model, get_inputs() and get_init_inputs()."

Backend = Annotated[str, Field(description="Backend to run on, e.g. 'cpu'. list_backends shows what this host offers.")]
CandidateCode = Annotated[str, Field(
    description="Python source defining class ModelNew(nn.Module) with its kernel (built with NVRTC via "
    "torch.cuda._compile_kernel, load_inline, or @triton.jit; see kforge://examples/{backend}).")]
ReferenceCode = Annotated[str, Field(description=_REFERENCE)]
Gpu = Annotated[int | None, Field(ge=0, description="Which GPU of the host to run on (its index; list_backends lists "
                                  "them); omitted: the least loaded one. Timing jobs never share a GPU.")]
PrecisionPolicy = Annotated[Precision, Field(
    description="strict: the candidate must match the reference's own precision (TF32 off in the reference). "
    "tf32/fp16/bf16: the candidate declares it computes in that lower precision; tolerances widen to what "
    "that precision implies, and the result states them.")]
BudgetS = Annotated[float, Field(gt=0, le=60, description="Time budget per timed model, seconds.")]


class _Inputs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ReferenceChoice(_Inputs):
    """How a tool call names its reference: its source, or a problem the server resolves to it."""

    reference_code: str | None = Field(default=None, description=f"{_REFERENCE} Give this or `problem`.")
    problem: str | None = Field(default=None, description=(
        "Name of a problem (resource kforge://problems) instead of reference_code: one of the server's pack, e.g. "
        "'softmax', or a KernelBench problem, e.g. 'kernelbench:level1/23_Softmax', where the server has a "
        "KernelBench checkout."))


class Waiting(_Inputs):
    """How long a heavy call waits for its job before answering with a handle (the server's default: KFORGE_JOB_WAIT_S)."""

    wait_s: float = Field(default=DEFAULT_WAIT_S, ge=0, le=3600, description=(
        "Seconds to wait for the result (the build, the verdict, the profile) before returning a job handle "
        "(status, job_id, progress); the job goes on and get_job(job_id) returns its result. The default suits "
        "clients that cancel calls after 60 s; the server caps it (KFORGE_JOB_MAX_WAIT_S)."))


class JobLookup(_Inputs):
    job_id: str = Field(description="A job_id from a job handle (or resource kforge://jobs).")


class SummarizeInputs(_Inputs):
    """What summarize_profile reads: a stored profile, pasted profiler output or screenshots (one of them)."""

    profile_id: str | None = Field(default=None, description="A profile_id returned by profile_kernel.")
    profile_text: str | None = Field(default=None, description="Pasted profiler output (torch.profiler table, Nsight "
                                     "Compute details as text or CSV).")
    screenshots: list[str] | None = Field(default=None, max_length=8, description=(
        "Base64 PNG or JPEG screenshots of profiler windows (Nsight Compute, Nsight Systems, Instruments, VTune); read "
        "by a vision-capable analyst, or by OCR where tesseract is installed."))
    candidate_code: str | None = Field(default=None, description="The candidate, so recommendations can point at lines.")
    previous_profile_id: str | None = Field(default=None, description="An earlier profile to report changes against.")
