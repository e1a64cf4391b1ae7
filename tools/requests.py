"""The heavy tool calls as data: what a job runs, stores, and runs again after a server restart.

Each request is a pydantic model (validated once, stored as JSON in the job table) with `run`, which
calls the plain tool function, and the model of its result, so a stored result can be read back.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from .context import Progress, ToolContext
from .evaluate import compile_kernel, verify_against_reference
from .models import CompileResult, ProfileResult, VerifyResult
from .profile import BASELINES, profile_kernel

__all__ = ["CompileRequest", "JobRequest", "ProfileRequest", "VerifyRequest", "parse_request", "request_key", "result_model"]

_Precision = Literal["strict", "tf32", "fp16", "bf16"]


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    result_type: ClassVar[type[BaseModel]]

    backend: str
    candidate_code: str
    #: the GPU's index; None: the job manager binds the least loaded one at submission (`JobManager.submit`)
    gpu: int | None = None


class CompileRequest(_Request):
    tool: Literal["compile_kernel"] = "compile_kernel"
    result_type: ClassVar[type[BaseModel]] = CompileResult
    reference_code: str | None = None
    use_store: bool = True

    async def run(self, ctx: ToolContext, progress: Progress) -> CompileResult:
        return await compile_kernel(ctx, self.backend, self.candidate_code, reference_code=self.reference_code,
                                    use_store=self.use_store, gpu=self.gpu, progress=progress)


class VerifyRequest(_Request):
    tool: Literal["verify_against_reference"] = "verify_against_reference"
    result_type: ClassVar[type[BaseModel]] = VerifyResult
    reference_code: str
    trials: int = 5
    atol: float | None = None
    rtol: float | None = None
    precision: _Precision = "strict"
    use_store: bool = True

    async def run(self, ctx: ToolContext, progress: Progress) -> VerifyResult:
        return await verify_against_reference(ctx, self.backend, self.reference_code, self.candidate_code,
                                              trials=self.trials, atol=self.atol, rtol=self.rtol,
                                              precision=self.precision, use_store=self.use_store, gpu=self.gpu,
                                              progress=progress)


class ProfileRequest(_Request):
    tool: Literal["profile_kernel"] = "profile_kernel"
    result_type: ClassVar[type[BaseModel]] = ProfileResult
    reference_code: str
    baselines: tuple[Literal["eager", "torch.compile"], ...] = BASELINES
    budget_s: float = 1.0
    precision: _Precision = "strict"
    hardware_counters: bool = True
    use_store: bool = False
    fresh_baselines: bool = False

    async def run(self, ctx: ToolContext, progress: Progress) -> ProfileResult:
        return await profile_kernel(ctx, self.backend, self.reference_code, self.candidate_code,
                                    baselines=self.baselines, budget_s=self.budget_s, precision=self.precision,
                                    hardware_counters=self.hardware_counters, use_store=self.use_store,
                                    fresh_baselines=self.fresh_baselines, gpu=self.gpu, progress=progress)


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
