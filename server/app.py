"""The MCP surface: registers KForge's tools and resources on an `MCPServer`.

Thin on purpose: each tool validates its arguments (pydantic, from the signature, which `tool_params.takes`
builds from the models that define the inputs: `kforge.tools.requests`, `kforge.tools.tool_inputs`), resolves a
named problem to its reference, forwards progress, and calls the plain function in
`kforge.tools`. Results go out as structured content (the model's JSON schema is the tool's
output schema), the result's human summary as text (its next step fitted to this host), a compact
JSON copy for clients that read only text (`compact.py`), and for profiles, charts (`pictures.py`).
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager, contextmanager, nullcontext
from typing import Annotated, Any, AsyncIterator, Awaitable, Callable, Iterator, Union

import anyio
from mcp import MCPError
from mcp.server.mcpserver import Context, MCPServer, Resolve, Sample
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.server.mcpserver.prompts.base import Prompt
from mcp.types import (INVALID_PARAMS, CallToolResult, CreateMessageResult, ImageContent, SamplingMessage, TextContent,
                       ToolAnnotations)
from pydantic import BaseModel, ConfigDict, Field, RootModel

from kforge import __version__
from kforge.backends import Availability
from kforge.profilers import binary_report_suffixes
from kforge.profilers.chart_processes import start_chart_processes
from kforge.tools.context import ToolContext, sweep_leftovers
from kforge.tools.tool_inputs import RequestError
from kforge.tools.gpus import describe_gpu
from kforge.tools.jobs import JobManager, JobStatus
from kforge.tools.models import CompileResult, ProfileResult, VerifyResult
from kforge.tools.process.lifecycle import traced
from kforge.tools.requests import CompileRequest, JobRequest, ProfileRequest, VerifyRequest
from kforge.tools.tool_inputs import Backend, JobLookup, ReferenceChoice, SummarizeInputs, Waiting
from kforge.resources import templates
from kforge.tools.summarize import AnalystConfig, Prepared, ProfileSummary, finish_summary, from_reply, prepare_summary, summarize_profile

from . import catalog
from .compact import compact_copy
from .pictures import artifact_uris, comparison_picture, profile_pictures
from .prewarm import prewarm_builds
from .schemas import compact_schema
from .settings import Settings, analyst_config, ray_fleet, tool_context
from .tool_params import takes

__all__ = ["build_server"]

log = logging.getLogger("kforge")

_INSTRUCTIONS = """KForge compiles, verifies, times and profiles kernels you write, on this host's accelerators.
Loop: read kforge://examples/{backend} once; write a KernelBench-format candidate (class ModelNew);
compile_kernel until it builds; verify_against_reference until correct (functional pass);
profile_kernel and summarize_profile, then improve (optimization pass). list_backends says what runs here.
Heavy calls wait up to wait_s; past that they return a job handle: get_job(job_id) waits for the result."""

_RUNS_CODE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)


class _KForgeServer(MCPServer):
    """The SDK's server, publishing each tool's output schema compacted once (`schemas.compact_schema`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._compacted: dict[str, dict[str, Any] | None] = {}  # by tool name: a tool's schema never changes

    async def list_tools(self) -> list[Any]:
        tools = await super().list_tools()
        for tool in tools:
            if tool.name not in self._compacted:
                self._compacted[tool.name] = compact_schema(tool.output_schema)
        return [tool.model_copy(update={"output_schema": self._compacted[tool.name]}) for tool in tools]


class BackendList(BaseModel):
    model_config = ConfigDict(frozen=True)

    backends: list[Availability]

    def __str__(self) -> str:
        lines = []
        for a in self.backends:
            lines.append(f"{a.backend}: {'available' if a.ok else 'unavailable'} ({a.reason})")
            lines += [f"  {describe_gpu(g)}" for g in a.gpus]
        usable = [a.backend for a in self.backends if a.ok]
        if usable:
            lines.append(f"Next: read kforge://examples/{usable[0]} (a verified reference and candidate), then "
                         f"write your candidate and compile_kernel it with backend='{usable[0]}'.")
        return "\n".join(lines)


def _result(model: BaseModel, *, text: str | None = None, images: list[ImageContent] | tuple[()] = ()) -> CallToolResult:
    """Summary text first, then any images, then a compact JSON copy (for clients that ignore structured content;
    the MCP specification advises one); the structured content has every field."""
    copy = json.dumps(compact_copy(model), separators=(",", ":"))
    return CallToolResult(content=[TextContent(type="text", text=str(model) if text is None else text), *images,
                                   TextContent(type="text", text=copy)],
                          structured_content=model.model_dump(mode="json", exclude_none=True))


@contextmanager
def _request_errors() -> Iterator[None]:
    """A request the tools cannot serve becomes a ToolError, whose text reaches the client."""
    try:
        yield
    except RequestError as exc:
        raise ToolError(str(exc)) from None


def _reference(reference_code: str | None, problem: str | None, problems: catalog.Problems) -> str:
    if (reference_code is None) == (problem is None):
        raise ToolError("pass exactly one of reference_code (KernelBench Model source) or problem "
                        f"(e.g. one of: {', '.join(catalog.problem_names())}; resource kforge://problems lists all)")
    if problem is not None:
        try:
            return problems.reference(problem)
        except catalog.UnknownProblem as exc:
            raise ToolError(str(exc)) from None
    return reference_code or ""


_SAMPLING_MAX_TOKENS = 2000
_Sampled = CreateMessageResult | None  # replaced by its Resolve annotation in build_server


def _sampled_text(result: CreateMessageResult) -> str:
    """The text of a sampling answer (one content block or a list of them)."""
    blocks = result.content if isinstance(result.content, list) else [result.content]
    return "".join(getattr(b, "text", "") for b in blocks)


def _progress(ctx: Context):
    async def report(done: float, total: float | None, message: str) -> None:
        await ctx.report_progress(done, total, message)
    return report


def _client_key(ctx: Context) -> str:
    """Whom a job is fair to: the HTTP session, else the client's name (one client per stdio server)."""
    headers = ctx.headers or {}
    if headers.get("mcp-session-id"):
        return f"session:{headers['mcp-session-id']}"
    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "client_info", None)
    return f"client:{info.name}" if info is not None else "anonymous"


def _or_job(*models: type[BaseModel]) -> type[RootModel]:
    """Output schema of a tool answering with one of `models` or a JobStatus (an object at the root, as MCP asks)."""
    union = Union[(*models, JobStatus)]  # noqa: UP007 - a runtime tuple of types
    name = "Or".join(m.__name__ for m in models) + "OrJob"
    return type(name, (RootModel[union],), {"model_config": ConfigDict(json_schema_extra={"type": "object"})})


def build_server(settings: Settings, tools: ToolContext | None = None, *, auth: dict[str, Any] | None = None,
                 on_start: Callable[[ToolContext], Awaitable[None]] | None = None) -> MCPServer:
    """The KForge MCP server for `settings` (all state lives in the returned server's ToolContext).

    `auth`: the SDK's `token_verifier` and `auth` arguments (HTTP only; see `kforge.server.auth`).
    `on_start`: run in the background once the server starts (the command line's banner)."""
    tools = tools or tool_context(settings)
    problems = catalog.Problems(settings.kernelbench_dir)
    fleet = ray_fleet(settings, tools)  # None: jobs run on this host
    offered = fleet.availability if fleet else tools.availability  # the backends where jobs run
    jobs = JobManager(tools, parallel=settings.ray_max_jobs if fleet else settings.parallel_jobs,
                      host_parallel=settings.ray_max_jobs if fleet else None,  # a fleet's jobs use its nodes' cores
                      queue_limit=settings.queue_limit, max_wait_s=settings.job_max_wait_s, executor=fleet)

    @asynccontextmanager
    async def lifespan(_server: MCPServer) -> AsyncIterator[dict[str, Any]]:
        # Jobs live as long as the server, not as long as a request; warm workers wait for them (on this host;
        # a fleet's nodes start theirs per job). First, the scratch left by servers that died mid-job.
        await anyio.to_thread.run_sync(sweep_leftovers, tools.home / "jobs")
        if not fleet:  # a fleet's nodes draw their profiles' charts
            start_chart_processes()
        async with tools.warm_workers(0 if fleet else settings.warm_workers), \
                (fleet.connected() if fleet else nullcontext()), jobs.running(), anyio.create_task_group() as tg:
            if on_start is not None:
                tg.start_soon(on_start, tools)
            if settings.precompiled_headers and not fleet:  # a fleet's nodes build their own
                tg.start_soon(prewarm_builds, tools)
            yield {}
            tg.cancel_scope.cancel()

    mcp = _KForgeServer("kforge", version=__version__, instructions=_INSTRUCTIONS, log_level="WARNING", lifespan=lifespan,
                    **(auth or {}))

    async def answer(model: BaseModel) -> CallToolResult:
        """A finished job's result, its status while it runs, or the tool error it failed with."""
        if isinstance(model, JobStatus) and model.status == "failed":
            raise ToolError(f"job {model.job_id} failed: {model.error}")
        if isinstance(model, VerifyResult):  # its next step: profile_kernel only where this host can time it
            found = {a.backend: a for a in await offered()}.get(model.spec.backend)
            timing_here = found is not None and found.ok and found.timing
            why = "" if timing_here or found is None else found.reason
            return _result(model, text=model.summary(timing_here=timing_here, why_not_timed=why))
        if isinstance(model, ProfileResult):  # drawing takes a few hundred ms of CPU: off the event loop
            with traced("server", "pictures", to=tools.limits.trace_file):
                model, images = await anyio.to_thread.run_sync(profile_pictures, tools.store, model)
            return _result(model, images=images)
        return _result(model)

    @mcp.tool(name="list_backends", title="List backends", annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def list_backends() -> Annotated[CallToolResult, BackendList]:
        """Which backends this host offers, and for each one that it does not, why; each GPU a backend runs on
        (index, name, uuid, memory, and its measured ceilings once measured)."""
        found = await offered()
        return _result(BackendList(backends=found if fleet else [tools.measured_gpus(a) for a in found]))

    async def run_job(ctx: Context, request: JobRequest, wait_s: float) -> CallToolResult:
        with _request_errors():
            with traced("server", request.tool, to=tools.limits.trace_file):
                job = await jobs.submit(request, _client_key(ctx))
                if isinstance(job, JobStatus):  # busy
                    return _result(job)
                return await answer(await jobs.wait(job, wait_s, _progress(ctx)))

    # Each tool's parameters are the fields of the models that define its inputs (`takes`): the request's, how
    # the reference is named (its source or a problem; the server resolves a problem), and the wait for the job.
    waits = {"wait_s": settings.job_wait_s}
    job_inputs = dict(exclude=("tool",), defaults=waits)

    def job_request(model: type[BaseModel], arguments: dict[str, Any], *, reference_needed: bool = True) -> JobRequest:
        """The job request of a tool call: its arguments, with the reference a named problem stands for."""
        reference_code, problem = arguments.pop("reference_code"), arguments.pop("problem")
        arguments.pop("wait_s")
        if reference_needed or reference_code or problem:
            arguments["reference_code"] = _reference(reference_code, problem, problems)
        return model(**arguments)

    @mcp.tool(name="compile_kernel", title="Compile a kernel candidate", annotations=_RUNS_CODE)
    @takes(CompileRequest, ReferenceChoice, Waiting, **job_inputs)
    async def compile_kernel_tool(ctx: Context, **arguments: Any) -> Annotated[CallToolResult, _or_job(CompileResult)]:
        """Build a candidate in an isolated worker. Returns whether it built, compiler errors and warnings
        located at lines of your candidate text, each kernel's registers, shared memory and spills, build
        seconds and whether the build came from cache. Triton compiles at first launch: give a reference or
        problem (optional) to launch the candidate once on its inputs and get the Triton kernels' resources.
        Long builds return a job handle: fetch the result with get_job."""
        wait_s = arguments["wait_s"]
        return await run_job(ctx, job_request(CompileRequest, arguments, reference_needed=False), wait_s)

    @mcp.tool(name="verify_against_reference", title="Verify a candidate against its reference", annotations=_RUNS_CODE)
    @takes(VerifyRequest, ReferenceChoice, Waiting, **job_inputs)
    async def verify_against_reference_tool(ctx: Context, **arguments: Any) -> Annotated[CallToolResult, _or_job(VerifyResult)]:
        """Run ModelNew and the reference Model (same initial weights) on fresh secret-seeded inputs from
        several distributions and judge it: every output's error (element-wise and relative to float64) with
        the tolerance and why; output contract (plain tensors, no aliasing, inputs unmodified); a second run
        after NaN-poisoning memory; no tampering, threads or global-state changes; whether your own kernels
        ran; and whether trivial outputs would pass this problem. `checks` lists each with its evidence.
        Long runs return a job handle: fetch the result with get_job."""
        wait_s = arguments["wait_s"]
        return await run_job(ctx, job_request(VerifyRequest, arguments), wait_s)

    @mcp.tool(name="profile_kernel", title="Time and profile a candidate", annotations=_RUNS_CODE)
    @takes(ProfileRequest, ReferenceChoice, Waiting, exclude=("tool",),
           defaults={**waits, "budget_s": settings.timing_budget_s})
    async def profile_kernel_tool(ctx: Context, **arguments: Any) -> Annotated[CallToolResult, _or_job(ProfileResult)]:
        """Time the candidate against the reference in eager mode and under torch.compile (medians, spread,
        samples, speedups), record a profiler breakdown (torch.profiler ops, the share of your own kernels,
        perf counters where allowed), store it and return its profile_id. Long runs return a job handle:
        fetch the result with get_job."""
        wait_s = arguments["wait_s"]
        return await run_job(ctx, job_request(ProfileRequest, arguments), wait_s)

    @mcp.tool(name="get_job", title="Get a job's result or progress",
              annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    @takes(JobLookup, Waiting, defaults=waits)
    async def get_job(ctx: Context, **arguments: Any,
                      ) -> Annotated[CallToolResult, _or_job(CompileResult, VerifyResult, ProfileResult)]:
        """The result of a compile, verify or profile job (exactly what the tool would have returned), or, while
        it runs, its status and progress after waiting up to wait_s. Works from any connection: a job goes on
        when the client that started it disconnects."""
        with _request_errors():
            return await answer(await jobs.wait_for(arguments["job_id"], arguments["wait_s"], _progress(ctx)))

    @mcp.tool(name="cancel_job", title="Cancel a job",
              annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                                          open_world_hint=False))
    @takes(JobLookup)
    async def cancel_job(**arguments: Any) -> Annotated[CallToolResult, _or_job(CompileResult, VerifyResult, ProfileResult)]:
        """Stop a queued or running job; its worker processes are killed with everything they started, and the
        answer comes once they are gone ('cancelled'). A job that already finished is left as it is (its result
        is returned)."""
        with _request_errors():
            return await answer(await jobs.cancel_and_wait(arguments["job_id"]))

    analyst = analyst_config(settings)

    def _prepare(profile_id: str | None, profile_text: str | None, screenshots: list[str] | None,
                 candidate_code: str | None, previous_profile_id: str | None) -> Prepared:
        return prepare_summary(tools, analyst, profile_id=profile_id, profile_text=profile_text, screenshots=screenshots,
                               code=candidate_code, previous_profile_id=previous_profile_id)

    def _sampling_request(ctx: Context, profile_id: str | None, profile_text: str | None,
                          screenshots: list[str] | None, candidate_code: str | None,
                          previous_profile_id: str | None) -> Sample | None:
        """Ask the client's own model (MCP sampling) when that is the configured analyst and the client can.

        Runs before the tool body, and on the 2026 protocol twice: the request must come out the same."""
        caps = ctx.client_capabilities
        if analyst.provider != "sampling" or caps is None or caps.sampling is None:
            return None
        try:
            request = _prepare(profile_id, profile_text, screenshots, candidate_code, previous_profile_id).request()
        except RequestError:
            return None  # the tool body raises it with its message
        content: list[TextContent | ImageContent] = [TextContent(type="text", text=request.user)]
        content += [ImageContent(type="image", data=im.data, mime_type=im.mime_type) for im in request.images]
        return Sample([SamplingMessage(role="user", content=content)], max_tokens=_SAMPLING_MAX_TOKENS,
                      system_prompt=request.system, temperature=0.0)

    async def summarize_profile_tool(sampled: _Sampled, **arguments: Any) -> Annotated[CallToolResult, ProfileSummary]:
        """Turn a stored profile, pasted profiler output or profiler screenshots into the bottleneck, its
        evidence, and ranked recommendations (what to change, where, why, expected effect, confidence).
        The analyst is the server's configured one (built-in rules by default); model analysts fall back to
        the rules and say so when they fail."""
        inputs = SummarizeInputs(**arguments)
        profile_id, previous_profile_id = inputs.profile_id, inputs.previous_profile_id
        with _request_errors():
            if analyst.provider != "sampling":
                summary = await summarize_profile(tools, analyst=analyst, profile_id=profile_id,
                                                  profile_text=inputs.profile_text, screenshots=inputs.screenshots,
                                                  code=inputs.candidate_code, previous_profile_id=previous_profile_id)
            else:
                prepared = _prepare(profile_id, inputs.profile_text, inputs.screenshots, inputs.candidate_code,
                                    previous_profile_id)
                if sampled is None:
                    analysis = from_reply(prepared, "sampling", None, "this client offers no sampling")
                else:
                    analysis = from_reply(prepared, f"sampling:{sampled.model}", _sampled_text(sampled))
                summary = finish_summary(prepared, analysis)
        images = []
        if previous_profile_id and profile_id:  # the change, as a picture
            image = await anyio.to_thread.run_sync(comparison_picture, tools.store, previous_profile_id, profile_id)
            images = [image] if image is not None else []
        return _result(summary, images=images)

    # The resolver is local to this server, and string annotations (PEP 563) are evaluated in the
    # module's globals: hand the SDK the real annotation object.
    summarize_profile_tool.__annotations__["sampled"] = Annotated[CreateMessageResult | None, Resolve(_sampling_request)]
    mcp.tool(name="summarize_profile", title="Summarize a profile",
             annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))(
        takes(SummarizeInputs)(summarize_profile_tool))

    _register_resources(mcp, tools, jobs, problems, offered)
    _register_prompts(mcp, tools, analyst, problems)
    return mcp


def _register_resources(mcp: MCPServer, tools: ToolContext, jobs: JobManager, problems: catalog.Problems,
                        offered: Callable[[], Awaitable[list[Availability]]]) -> None:
    @mcp.resource("kforge://jobs", mime_type="application/json", title="Recent jobs")
    def recent_jobs() -> str:
        """The latest compile, verify and profile jobs, newest first, with their status: find a job whose handle
        was lost (for example when the client gave up on the call), then get_job(job_id)."""
        return json.dumps(jobs.recent(50), indent=1)

    @mcp.resource("kforge://backends", mime_type="application/json", title="Backends on this host")
    async def backends() -> str:
        """Every backend KForge knows, whether this host (or the fleet's nodes) offers it, and why not."""
        return json.dumps([a.model_dump(mode="json") for a in await offered()], indent=1)

    @mcp.resource("kforge://format", mime_type="text/markdown", title="The candidate format")
    def candidate_format() -> str:
        """How references and candidates are written (KernelBench format) and what KForge checks."""
        return catalog.candidate_format()

    @mcp.resource("kforge://examples/{backend}", mime_type="text/x-python", title="Verified example per backend")
    def example(backend: str) -> str:
        """One complete, verified reference + candidate pair for a backend: enough to target it."""
        pair = catalog.example(backend)
        if pair is None:
            raise ResourceNotFoundError(f"no example for backend {backend!r}; have: {', '.join(catalog.example_backends())}")
        return f"# ---- reference.py ----\n{pair['reference']}\n# ---- candidate.py ----\n{pair['candidate']}"

    @mcp.resource("kforge://problems", mime_type="application/json", title="Problem pack")
    def problem_names() -> str:
        """Names of the problems that tools accept as `problem=`: the pack's, and KernelBench's
        ('kernelbench:level1/23_Softmax') where the server has a KernelBench checkout (KFORGE_KERNELBENCH_DIR)."""
        return json.dumps(problems.names())

    # {+name}: KernelBench names hold '/' and ':' (kforge://problems/kernelbench:level1/23_Softmax).
    @mcp.resource("kforge://problems/{+name}", mime_type="text/x-python", title="A problem's reference")
    def problem(name: str) -> str:
        """The reference (Model, get_inputs, get_init_inputs) of a problem (kforge://problems lists them)."""
        try:
            return problems.reference(name)
        except catalog.UnknownProblem as exc:
            raise ResourceNotFoundError(str(exc)) from None

    @mcp.resource("kforge://profiles", mime_type="application/json", title="Stored profiles")
    def profiles() -> str:
        """The most recent stored profiles, newest first."""
        return json.dumps(tools.store.list_profiles(50), indent=1)

    @mcp.resource("kforge://profiles/{profile_id}", mime_type="application/json", title="A stored profile")
    def stored_profile(profile_id: str) -> str:
        """A stored profile: timings, baselines, op table, counters and links to its raw artifacts."""
        found = tools.store.get_profile(profile_id)
        if found is None:
            raise ResourceNotFoundError(f"no stored profile {profile_id!r}")
        return json.dumps({**found, "artifacts": artifact_uris(tools.store, profile_id)}, indent=1)

    # Registered first: the SDK serves the first template that matches, and a chart is an image, not text.
    @mcp.resource("kforge://profiles/{profile_id}/artifacts/{name}.png", mime_type="image/png",
                  title="A profile's chart")
    def chart(profile_id: str, name: str) -> bytes:
        """A chart of a profile (PNG): timings.png (candidate against baselines, with intervals), roofline.png
        (against the device's measured ceilings), vs-{previous_profile_id}.png (summarize_profile's before/after)."""
        path = tools.store.artifact_path(profile_id, f"{name}.png")
        if path is None:
            raise ResourceNotFoundError(f"profile {profile_id!r} has no chart {name + '.png'!r}; "
                                        f"it has: {', '.join(tools.store.artifact_names(profile_id)) or 'none'}")
        return path.read_bytes()

    @mcp.resource("kforge://profiles/{profile_id}/artifacts/{name}", title="A profile's raw artifact")
    def artifact(profile_id: str, name: str) -> str | bytes:
        """A raw artifact of a profile: trace.json (open in Perfetto or chrome://tracing), a hardware profiler's
        report (profile.ncu-rep: open in Nsight Compute; sent as binary), worker and profiler logs."""
        path = tools.store.artifact_path(profile_id, name)
        if path is None:
            raise ResourceNotFoundError(f"profile {profile_id!r} has no artifact {name!r}; "
                                        f"it has: {', '.join(tools.store.artifact_names(profile_id)) or 'none'}")
        return path.read_bytes() if path.suffix in binary_report_suffixes() else path.read_text(errors="replace")

    @mcp.resource("kforge://devices", mime_type="application/json", title="Devices and their measured ceilings")
    async def devices() -> str:
        """The devices this host offers (per backend; each GPU with its index, uuid and memory) and the ceilings
        measured on them (device copy bandwidth, matmul rates), which profile_kernel reads fractions against. Run
        `kforge doctor` to measure them."""
        measured = {p.stem: json.loads(p.read_text()) for p in sorted((tools.home / "cache" / "ceilings").glob("*.json"))}
        offered = [{"backend": a.backend, "device": a.device_name, "timing": a.timing, "hardware_profiler": a.hardware_profiler,
                    **({"gpus": [g.model_dump(mode="json") for g in tools.measured_gpus(a).gpus]} if a.gpus else {})}
                   for a in await tools.availability() if a.ok]
        return json.dumps({"backends": offered, "measured_ceilings": measured,
                           "note": None if measured else "no ceilings measured yet: run `kforge doctor` or profile_kernel"},
                          indent=1)

    @mcp.resource("kforge://history", mime_type="application/json", title="Problems with a history")
    def history_index() -> str:
        """Problems that candidates were verified or profiled against, newest first; read
        kforge://history/{problem} (a pack name or the reference's sha256) for one problem's history."""
        names = problems.by_sha256()
        rows = tools.store.problems_with_history()
        return json.dumps([{**r, "problem": names.get(r["reference_sha256"])} for r in rows], indent=1)

    @mcp.resource("kforge://history/{+problem}", mime_type="application/json", title="A problem's candidates")
    def problem_history(problem: str) -> str:
        """Every verify and profile of candidates for one problem (a pack name, or the reference's sha256 as in
        a result's spec), oldest first, with the best trusted speedup so far: resume and compare passes."""
        sha = {v: k for k, v in problems.by_sha256().items()}.get(problem, problem)
        entries = tools.store.history(sha)
        if not entries:
            raise ResourceNotFoundError(f"no history for problem {problem!r}: verify or profile a candidate for it first")
        best = max((e for e in entries if e["trusted"] and e["speedup_eager"] is not None),
                   key=lambda e: e["speedup_eager"], default=None)
        return json.dumps({"reference_sha256": sha, "entries": entries, "best": best}, indent=1)


class _NamedArgumentsPrompt(Prompt):
    """A prompt whose argument errors reach the client: the SDK answers a missing argument with a bare
    "Internal server error" (the reason stays in the server log), so check first and say which."""

    async def render(self, arguments: dict[str, Any] | None, context: Any) -> Any:
        required = [a.name for a in self.arguments or [] if a.required]
        missing = [name for name in required if name not in (arguments or {})]
        if missing:
            raise _prompt_error(f"prompt {self.name} needs the argument(s) {', '.join(missing)} "
                                f"(required: {', '.join(required)})")
        return await super().render(arguments, context)


def _prompt_error(message: str) -> MCPError:
    """A bad prompt argument, said to the client: prompts have no error result, so a JSON-RPC error (invalid
    params) whose message the client shows."""
    return MCPError(INVALID_PARAMS, message)


def _register_prompts(mcp: MCPServer, tools: ToolContext, analyst: AnalystConfig, problems: catalog.Problems) -> None:
    """The generation agent's two passes, rendered from resources/prompts/*.md.j2."""

    def prompt(name: str, title: str) -> Any:
        def register(fn: Any) -> Any:
            mcp.add_prompt(_NamedArgumentsPrompt.from_function(fn, name=name, title=title))
            return fn
        return register

    async def common(backend: str, problem: str) -> dict[str, str]:
        pair = catalog.example(backend)
        if pair is None:
            raise _prompt_error(f"argument backend: no example for backend {backend!r}; have: "
                                f"{', '.join(catalog.example_backends())}")
        named = None
        if "\n" not in problem:  # a name, not a reference's source
            try:
                named = problems.reference(problem)
            except catalog.UnknownProblem as exc:
                raise _prompt_error(f"argument problem: {exc}") from None
        found = {a.backend: a for a in await tools.availability()}.get(backend)
        return {"backend": backend, "device": (found.device_name or "") if found else "",
                "problem_name": problem if named else "", "reference": named or problem,
                "example_reference": pair["reference"], "example_candidate": pair["candidate"]}

    @prompt(name="functional_pass", title="Functional pass: make a candidate build and match its reference")
    async def functional_pass(
        backend: Backend,
        problem: Annotated[str, Field(description="A pack problem's name (kforge://problems) or a reference's source.")],
        candidate_code: Annotated[str, Field(description="The current candidate, if any.")] = "",
        feedback: Annotated[str, Field(description="Compiler or verifier output to act on.")] = "",
        transfer_backend: Annotated[str, Field(description="Backend of a verified implementation to port.")] = "",
        transfer_code: Annotated[str, Field(description="That verified implementation (cross-platform transfer).")] = "",
    ) -> str:
        """Instructions, the backend's verified example, the problem and the latest feedback, for making a candidate correct."""
        return templates.render("functional_pass.md.j2", **await common(backend, problem), candidate=candidate_code,
                                feedback=feedback, transfer_backend=transfer_backend, transfer_code=transfer_code)

    @prompt(name="optimization_pass", title="Optimization pass: make a correct candidate faster")
    async def optimization_pass(
        backend: Backend,
        problem: Annotated[str, Field(description="A pack problem's name (kforge://problems) or a reference's source.")],
        candidate_code: Annotated[str, Field(description="The verified candidate to speed up.")],
        profile_id: Annotated[str, Field(description="Its profile (profile_kernel); the analyst's findings are included.")] = "",
        transfer_backend: Annotated[str, Field(description="Backend of a fast implementation to learn from.")] = "",
        transfer_code: Annotated[str, Field(description="That implementation (cross-platform transfer).")] = "",
    ) -> str:
        """Instructions, the candidate, the profile's bottleneck and ranked recommendations, for making it faster."""
        analysis = ""
        if profile_id:
            try:
                prepared = prepare_summary(tools, AnalystConfig(), profile_id=profile_id, code=candidate_code)
                analysis = str(prepared.rules) if prepared.rules else ""
            except RequestError as exc:
                analysis = f"(profile {profile_id!r} could not be read: {exc})"
        return templates.render("optimization_pass.md.j2", **await common(backend, problem), candidate=candidate_code,
                                analysis=analysis, transfer_backend=transfer_backend, transfer_code=transfer_code)
