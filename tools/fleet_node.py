"""What a Ray node runs for the fleet (`kforge.tools.fleet`): a `NodeAgent` actor, one per node, that runs the
node's jobs through the same tool functions and the same isolated worker processes as a single host, with a warm
worker pool of its own and the node's own data directory.

Why an actor: a job run as a plain Ray task started its workers cold (a 4-5 s interpreter and torch import each,
two or three per job) and forgot its baselines and kept workers with its Ray worker. The agent lives as long as
the server's connection: its pool keeps workers warm, kept judges and candidates carry from one job to the next,
and its `ToolContext` queues the node's jobs per device as a single host does (timings never share a device).

A job arrives as its request (candidate and reference source, options); nothing of the server's data directory
travels. The agent streams `NodeEvent`s back: where it runs, its progress, and at the end its result with the store
records it wrote (results, history, profiles and their artifacts), which the server writes into its own store, so
get_job, the profiles, their artifacts and the history stay whole there.

Ray imports this module on the node by reference (every node has kforge installed); it imports ray only to
name the node it runs on.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, AsyncIterator, Literal

import anyio
import platformdirs

from kforge import __version__

from .context import ToolContext, sweep_leftovers

from .tool_inputs import DEFAULT_BUDGET_S, RequestError
from .dispatch import run_request
from .requests import parse_request
from .process.limits import WorkerLimits
from .store import ResultStore

__all__ = ["NodeAgent", "NodeConfig", "NodeEvent", "StoreWrites", "node_home", "replay_writes"]

# A profile's artifacts (Chrome trace, worker logs) go back with its result up to this size; past it the rest
# stay on the node and the server's copy lists what it has.
_ARTIFACTS_MAX_BYTES = 256 * 2**20


@dataclass(frozen=True)
class NodeConfig:
    """What a node needs besides the request: where its data directory is, the workers' limits, how many workers
    its pool keeps warm per kind, and how many jobs it runs at once.

    `home` None: the node's own default data directory (the user data directory of the account Ray runs as).
    `slots` None: one job per CPU the agent was given (`RayFleet` gives it the node's CPUs, and as many slots as
    jobs of `threads` CPUs fit)."""

    limits: WorkerLimits
    home: str | None = None
    keep_scratch: bool = False
    warm_workers: int = 0
    slots: int | None = None
    threads: int | None = None  # OpenMP threads of a job's workers (`RayFleet`: its CPUs); None: as Ray set them
    trace: bool = False  # append the node's trace (worker starts, ops, forks) to `trace.jsonl` in its data directory
    warm_baselines: str = "gpu"  # `ToolContext.warm_baselines`
    warm_timing: bool = True  # `ToolContext.warm_timing`
    timing_budget_s: float = DEFAULT_BUDGET_S  # `ToolContext.timing_budget_s`: the server's default budget
    max_forks: int = 0  # `ToolContext.max_forks`


@dataclass
class StoreWrites:
    """What a job wrote to the node's store, to be written again into the server's."""

    results: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # key, tool, result
    history: list[dict[str, Any]] = field(default_factory=list)  # record_history's keyword arguments
    profiles: list[tuple[str, str, str, dict[str, Any]]] = field(default_factory=list)  # id, key, backend, result
    artifacts: dict[str, dict[str, bytes]] = field(default_factory=dict)  # profile_id -> file name -> content


@dataclass(frozen=True)
class NodeEvent:
    """One item of a job's stream: 'started' (node, address, kforge version), 'progress', 'result' (the tool's
    result as JSON and the store's writes) or 'request_error' (a request this node cannot serve, and why)."""

    kind: Literal["started", "progress", "result", "request_error"]
    node: str = ""
    address: str = ""
    version: str = ""
    done: float | None = None
    total: float | None = None
    message: str = ""
    result: dict[str, Any] | None = None
    writes: StoreWrites | None = None


# The writes of the job whose task (or a task it started) writes to the store: an agent runs several jobs at once.
_job_writes: contextvars.ContextVar[StoreWrites | None] = contextvars.ContextVar("kforge_job_writes", default=None)


class _RecordingStore(ResultStore):
    """The node's own store, noting each write in the writes of the job that made it, to be sent to the server."""

    def put_result(self, key: str, tool: str, result: dict[str, Any]) -> bool:
        kept = super().put_result(key, tool, result)
        if kept and (writes := _job_writes.get()) is not None:
            writes.results.append((key, tool, result))
        return kept

    def record_history(self, **fields: Any) -> None:
        super().record_history(**fields)
        if (writes := _job_writes.get()) is not None:
            writes.history.append(fields)

    def put_profile(self, profile_id: str, key: str, backend: str, result: dict[str, Any]) -> None:
        super().put_profile(profile_id, key, backend, result)
        if (writes := _job_writes.get()) is not None:
            writes.profiles.append((profile_id, key, backend, result))

    def artifact_dir(self, profile_id: str) -> Path:
        if (writes := _job_writes.get()) is not None:
            writes.artifacts.setdefault(profile_id, {})
        return super().artifact_dir(profile_id)

    def collect(self, writes: StoreWrites) -> StoreWrites:
        """`writes`, with the artifact files of every profile the job wrote (up to `_ARTIFACTS_MAX_BYTES`)."""
        budget = _ARTIFACTS_MAX_BYTES
        for profile_id in sorted(writes.artifacts):
            files: dict[str, bytes] = {}
            for name in self.artifact_names(profile_id):
                path = self.artifact_path(profile_id, name)
                if path is not None and path.stat().st_size <= budget:
                    files[name] = path.read_bytes()
                    budget -= len(files[name])
            writes.artifacts[profile_id] = files
        return writes


def node_home(config: NodeConfig) -> Path:
    return Path(config.home).expanduser() if config.home else Path(platformdirs.user_data_dir("kforge"))


def _where() -> tuple[str, str]:
    """This node's Ray id and address (the host name outside a Ray worker)."""
    try:
        import ray  # present on every Ray node; imported here only to name the node

        if not ray.is_initialized():  # not in a Ray worker: asking the runtime context would start a local Ray
            return "", socket.gethostname()
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - naming the node must not fail the job
        return "", socket.gethostname()


class NodeAgent:
    """A node's KForge (a Ray actor, asyncio): one `ToolContext` on the node's data directory, its warm pool,
    and at most `slots` jobs at a time; the rest wait here, in order, for a slot."""

    def __init__(self, config: NodeConfig, cpus: float = 1.0) -> None:
        self.config = config
        if config.threads:  # the agent holds the node's CPUs, and Ray set OMP_NUM_THREADS to all of them: a job's
            os.environ["OMP_NUM_THREADS"] = str(config.threads)  # workers (who inherit it) get their own share
        home = node_home(config)
        sweep_leftovers(home / "jobs")  # of this node's earlier agents that died mid-job
        # The server's trace file is a path of its own host: a node traces into its own data directory.
        limits = replace(config.limits, trace_file=str(home / "trace.jsonl") if config.trace else None)
        self.tools = ToolContext(home=home, limits=limits, keep_scratch=config.keep_scratch,
                                 warm_baselines=config.warm_baselines, max_forks=config.max_forks,
                                 warm_timing=config.warm_timing, timing_budget_s=config.timing_budget_s,
                                 late_baselines=False)  # the head keeps the node's profiles: none completes later
        self.tools.store = self.store = _RecordingStore(home)
        self.slots = asyncio.Semaphore(config.slots or max(1, int(cpus)))
        self._pool_task: asyncio.Task[None] | None = None
        self._node, self._address = _where()

    async def _with_pool(self) -> None:
        """Keep the node's warm workers while the agent lives (its pool runs in this task, as a server's lifespan)."""
        async with self.tools.warm_workers(self.config.warm_workers):
            await anyio.sleep_forever()

    def _start_pool(self) -> None:
        if self._pool_task is None and self.config.warm_workers > 0:
            self._pool_task = asyncio.ensure_future(self._with_pool())

    async def stop(self) -> None:
        """End the pool (its warm workers and fork servers killed with their process groups) before the actor goes."""
        if self._pool_task is not None:
            self._pool_task.cancel()
            await asyncio.wait({self._pool_task})
            self._pool_task = None

    async def probe(self) -> list[dict[str, Any]]:
        """The backends this node offers (`ToolContext.availability`, probed in a worker), as JSON; starts the pool."""
        found = [a.model_dump(mode="json") for a in await self.tools.availability()]
        self._start_pool()
        return found

    async def run_job(self, request: dict[str, Any]) -> AsyncIterator[NodeEvent]:
        """Run one job request on this node, yielding its events (a Ray streaming generator method).

        The job runs in a task of its own, exactly as the server runs it (`dispatch.run_request`); this generator
        relays its progress. When Ray cancels the call (`ray.cancel`: the generator's task is cancelled), the job's
        task is cancelled and awaited, so its worker processes are killed with their process groups as on a
        single host before the cancel completes."""
        self._start_pool()
        async with self.slots:
            yield NodeEvent(kind="started", node=self._node, address=self._address, version=__version__)
            events: asyncio.Queue[NodeEvent | None] = asyncio.Queue()  # None: the job ended
            writes = StoreWrites()

            async def progress(done: float, total: float | None, message: str) -> None:
                events.put_nowait(NodeEvent(kind="progress", done=done, total=total, message=message))

            async def run() -> dict[str, Any]:
                _job_writes.set(writes)  # this task's context: the job's tasks inherit it
                result = await run_request(self.tools, parse_request(request), progress)
                return result.model_dump(mode="json", exclude_none=True)

            job = asyncio.ensure_future(run())
            job.add_done_callback(lambda _: events.put_nowait(None))  # after every progress event it sent
            try:
                while (event := await events.get()) is not None:
                    yield event
            except BaseException:  # cancelled (ray.cancel), closed: stop the job, its workers killed, then go
                job.cancel()
                await asyncio.wait({job})
                raise
            try:
                result = job.result()
            except RequestError as exc:
                yield NodeEvent(kind="request_error", node=self._node, address=self._address, message=str(exc))
                return
            yield NodeEvent(kind="result", node=self._node, address=self._address, result=result,
                            writes=self.store.collect(writes))


def replay_writes(store: ResultStore, writes: StoreWrites) -> None:
    """Write a node's store records into the server's `store` (the server stays the home of every result)."""
    for key, tool, result in writes.results:
        store.put_result(key, tool, result)
    for fields in writes.history:
        store.record_history(**fields)
    for profile_id, key, backend, result in writes.profiles:
        store.put_profile(profile_id, key, backend, result)
    for profile_id, files in writes.artifacts.items():
        where = store.artifact_dir(profile_id)  # checks the id
        for name, content in files.items():
            if Path(name).name != name or name.startswith("."):
                continue  # names come from the node's own store; never write outside the profile's folder
            (where / name).write_bytes(content)
