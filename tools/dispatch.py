"""Run a job's request (`kforge.tools.requests`) through the plain tool function it names: the one place that knows
both, so the requests stay data and the tools import nothing above them."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from pydantic import BaseModel

from .context import Progress, ToolContext
from .evaluate import compile_kernel, verify_against_reference
from .profile import profile_kernel

__all__ = ["run_request"]

_TOOLS: dict[str, Callable[[ToolContext, Any, Progress], Awaitable[BaseModel]]] = {
    "compile_kernel": compile_kernel,
    "verify_against_reference": verify_against_reference,
    "profile_kernel": profile_kernel,
}


async def run_request(ctx: ToolContext, request: Any, progress: Progress) -> BaseModel:
    """The result of the tool `request.tool`, run on this host with `ctx`. A job type of its own (a plugin's, or a
    test's stand-in for a tool) brings its `run(ctx, progress)` and runs itself."""
    runs_itself = getattr(request, "run", None)
    if runs_itself is not None:
        return await runs_itself(ctx, progress)
    return await _TOOLS[request.tool](ctx, request, progress)
