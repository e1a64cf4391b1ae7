"""The heavy tool calls as data: what a job runs, stores, and runs again after a server restart.

Each request is a pydantic model (validated once, stored as JSON in the job table) with the model of its result,
so a stored result can be read back; `kforge.tools.dispatch.run_request` runs the tool it names.
Their fields are the one definition of these tools' inputs (type, default, bounds, description): the
MCP server builds the tools' parameters from them (`kforge.server.tool_params`).
"""

from __future__ import annotations

import hashlib
from typing import Annotated, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from .models import CompileResult, ProfileResult, VerifyResult
from .tool_inputs import BASELINES, DEFAULT_BUDGET_S, Backend, BudgetS, CandidateCode, Gpu, PrecisionPolicy, ReferenceCode

__all__ = ["CompileRequest", "JobRequest", "ProfileRequest", "VerifyRequest", "parse_request", "request_key", "result_model"]

_USE_STORE = "Return a stored answer for an identical earlier request when one exists."


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    result_type: ClassVar[type[BaseModel]]

    backend: Backend
    candidate_code: CandidateCode
    #: None: the job manager binds the least loaded GPU at submission (`JobManager.submit`)
    gpu: Gpu = None


class CompileRequest(_Request):
    tool: Literal["compile_kernel"] = "compile_kernel"
    result_type: ClassVar[type[BaseModel]] = CompileResult
    reference_code: str | None = Field(default=None, description="Python source defining class Model, get_inputs() and "
                                       "get_init_inputs(): the candidate is launched once on its inputs (Triton "
                                       "compiles at first launch).")
    use_store: bool = Field(default=True, description=_USE_STORE)


class VerifyRequest(_Request):
    tool: Literal["verify_against_reference"] = "verify_against_reference"
    result_type: ClassVar[type[BaseModel]] = VerifyResult
    reference_code: ReferenceCode
    trials: int = Field(default=5, ge=1, le=50, description="Trials, each with fresh random inputs.")
    atol: float | None = Field(default=None, ge=0, description="Override the per-dtype absolute tolerance.")
    rtol: float | None = Field(default=None, ge=0, description="Override the per-dtype relative tolerance.")
    precision: PrecisionPolicy = "strict"
    use_store: bool = Field(default=True, description=_USE_STORE)


class ProfileRequest(_Request):
    tool: Literal["profile_kernel"] = "profile_kernel"
    result_type: ClassVar[type[BaseModel]] = ProfileResult
    reference_code: ReferenceCode
    baselines: tuple[Literal["eager", "torch.compile"], ...] = Field(default=BASELINES, description=(
        "Reference baselines, timed in rounds interleaved with the candidate's. Eager is always timed in this run; "
        "torch.compile is reused from a profile of the same reference on this device in the last 10 minutes while "
        "eager still times within 2% of eager then (see reused_after_s)."))
    budget_s: BudgetS = DEFAULT_BUDGET_S
    precision: PrecisionPolicy = "strict"
    hardware_counters: bool = Field(default=True, description="Also run the candidate under Nsight Compute on a GPU "
                                    "(about 10-20 s more); False for timing only.")
    use_store: bool = Field(default=False, description="Return the latest stored profile of an identical request "
                            "instead of measuring again.")
    fresh_baselines: bool = Field(default=False, description="Time every baseline in this run, reusing none.")
    late_baselines: bool = Field(default=True, description=(
        "A new problem's torch.compile baseline that is still compiling ahead (started by its verify or compile) is "
        "timed after this profile answers and added to it (kforge://profiles/{profile_id}, summarize_profile), "
        "instead of the profile waiting seconds for its compile. False: wait for it."))


JobRequest = Annotated[Union[CompileRequest, VerifyRequest, ProfileRequest], Field(discriminator="tool")]
_ADAPTER: TypeAdapter[JobRequest] = TypeAdapter(JobRequest)
_RESULTS: dict[str, type[BaseModel]] = {r.model_fields["tool"].default: r.result_type
                                        for r in (CompileRequest, VerifyRequest, ProfileRequest)}


def parse_request(data: dict) -> CompileRequest | VerifyRequest | ProfileRequest:
    return _ADAPTER.validate_python(data)


def request_key(request: BaseModel) -> str:
    """Identical requests share a key: a repeated call attaches to the job already running it."""
    return hashlib.sha256(request.model_dump_json().encode()).hexdigest()


def result_model(tool: str) -> type[BaseModel]:
    return _RESULTS[tool]
