"""What a Ray node runs for the fleet (`kforge.tools.fleet`): one job, through the same tool functions and the
same isolated worker processes as a single host, on the node's own data directory.

The job arrives as its request (candidate and reference source, options) and a `NodeConfig`; nothing of the
server's data directory travels. The node streams `NodeEvent`s back: where it runs, its progress, and at the
end its result with the store records it wrote (results, history, profiles and their artifacts), which the
server writes into its own store, so get_job, the profiles, their artifacts and the history stay whole there.

Ray imports this module on the node by reference (every node has kforge installed); it imports ray only to
name the node it runs on.
"""

from __future__ import annotations

import queue
import signal
import socket
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

import anyio
import anyio.from_thread
import platformdirs

from kforge import __version__

from .context import ToolContext, sweep_leftovers

from .tool_inputs import RequestError
from .dispatch import run_request
from .requests import parse_request
from .process.limits import WorkerLimits
from .store import ResultStore

__all__ = ["NodeConfig", "NodeEvent", "StoreWrites", "node_home", "probe_node", "replay_writes", "run_job_here"]

# A profile's artifacts (Chrome trace, worker logs) go back with its result up to this size; past it the rest
# stay on the node and the server's copy lists what it has.
_ARTIFACTS_MAX_BYTES = 256 * 2**20
# How often the stream looks whether the job finished while no progress came (seconds).
_POLL_S = 0.1


@dataclass(frozen=True)
class NodeConfig:
    """What a node needs besides the request: where its data directory is and the workers' limits.

    `home` None: the node's own default data directory (the user data directory of the account Ray runs as)."""

    limits: WorkerLimits
    home: str | None = None
    keep_scratch: bool = False


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


class _RecordingStore(ResultStore):
    """The node's own store, noting every write so it can be sent to the server."""

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.writes = StoreWrites()
        self._profile_dirs: set[str] = set()

    def put_result(self, key: str, tool: str, result: dict[str, Any]) -> bool:
        kept = super().put_result(key, tool, result)
        if kept:
            self.writes.results.append((key, tool, result))
        return kept

    def record_history(self, **fields: Any) -> None:
        super().record_history(**fields)
        self.writes.history.append(fields)

    def put_profile(self, profile_id: str, key: str, backend: str, result: dict[str, Any]) -> None:
        super().put_profile(profile_id, key, backend, result)
        self.writes.profiles.append((profile_id, key, backend, result))

    def artifact_dir(self, profile_id: str) -> Path:
        self._profile_dirs.add(profile_id)
        return super().artifact_dir(profile_id)

    def collect(self) -> StoreWrites:
        """The writes, with the artifact files of every profile the job wrote (up to `_ARTIFACTS_MAX_BYTES`)."""
        budget = _ARTIFACTS_MAX_BYTES
        for profile_id in sorted(self._profile_dirs):
            files: dict[str, bytes] = {}
            for name in self.artifact_names(profile_id):
                path = self.artifact_path(profile_id, name)
                if path is not None and path.stat().st_size <= budget:
                    files[name] = path.read_bytes()
                    budget -= len(files[name])
            self.writes.artifacts[profile_id] = files
        return self.writes


def node_home(config: NodeConfig) -> Path:
    return Path(config.home).expanduser() if config.home else Path(platformdirs.user_data_dir("kforge"))


# One ToolContext per node configuration in this (Ray worker) process: the backends are probed once, and the
# baseline timings it remembers are reused as on a single host. Ray runs one task at a time in a worker.
_contexts: dict[NodeConfig, ToolContext] = {}


def _tools(config: NodeConfig) -> ToolContext:
    if config not in _contexts:
        home = node_home(config)
        sweep_leftovers(home / "jobs")  # of this node's earlier Ray workers that died mid-job
        _contexts[config] = ToolContext(home=home, limits=config.limits, keep_scratch=config.keep_scratch)
    return _contexts[config]


def _where() -> tuple[str, str]:
    """This node's Ray id and address (the host name outside a Ray worker)."""
    try:
        import ray  # present on every Ray node; imported here only to name the node

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - naming the node must not fail the job
        return "", socket.gethostname()


def _let_ray_interrupt() -> None:
    """Let `ray.cancel` interrupt this task: Ray raises KeyboardInterrupt in the task's thread through Python's SIGINT
    handler (`_thread.interrupt_main`), which does nothing where SIGINT is ignored. A Ray node started from a
    background shell (`ray start ... &`, nohup, a job scheduler) passes an ignored SIGINT down to every worker: a
    cancelled job then ran on, its workers too (the fleet's cancel test under a backgrounded pytest, 2026-11-27)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_job_here(config: NodeConfig, request: dict[str, Any]) -> Iterator[NodeEvent]:
    """Run one job request on this node, yielding its events (a Ray streaming generator task's body).

    The job runs in an event loop of its own thread (an anyio blocking portal), exactly as the server runs it
    (`dispatch.run_request` with a `ToolContext` of this node); this thread relays its progress. When Ray cancels the
    task (`ray.cancel`), the generator is closed: the job's task is cancelled, so its worker processes are
    killed with their process groups as on a single host, and the portal waits for that before it returns."""
    _let_ray_interrupt()
    node, address = _where()
    yield NodeEvent(kind="started", node=node, address=address, version=__version__)
    tools = _tools(config)
    tools.store = store = _RecordingStore(tools.home)
    events: queue.SimpleQueue[NodeEvent] = queue.SimpleQueue()

    async def progress(done: float, total: float | None, message: str) -> None:
        events.put(NodeEvent(kind="progress", done=done, total=total, message=message))

    async def run() -> dict[str, Any]:
        result = await run_request(tools, parse_request(request), progress)
        return result.model_dump(mode="json", exclude_none=True)

    with anyio.from_thread.start_blocking_portal() as portal:
        future: Future[dict[str, Any]] = portal.start_task_soon(run)
        try:
            while not (future.done() and events.empty()):
                try:
                    yield events.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
        except BaseException:  # GeneratorExit (ray.cancel), KeyboardInterrupt: stop the job, kill its workers
            future.cancel()
            raise
    try:
        result = future.result()
    except RequestError as exc:
        yield NodeEvent(kind="request_error", node=node, address=address, message=str(exc))
        return
    yield NodeEvent(kind="result", node=node, address=address, result=result, writes=store.collect())


def probe_node(config: NodeConfig) -> list[dict[str, Any]]:
    """The backends this node offers (`ToolContext.availability`, probed in a worker), as JSON."""
    tools = _tools(config)
    return [a.model_dump(mode="json") for a in anyio.run(tools.availability)]


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
