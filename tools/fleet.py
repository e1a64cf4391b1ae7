"""The fleet: compile, verify and profile jobs run on a Ray cluster instead of this host.

The server's `JobManager` stays the single owner of job state (the queue, the job store, get_job, cancel_job);
`RayFleet` is only where a job executes. Each node of the cluster runs one `NodeAgent` actor
(`kforge.tools.fleet_node`), made when the server connects (and for nodes that join later): the node's KForge,
with the same tool functions, isolated worker processes and warm worker pool as a single host, on the node's own
data directory. A job is one call of an agent's streaming method, which sends back its progress, its result and the
store records it wrote, which are written into the server's store.

- **Placement:** a job goes to the agent, among those whose node offers its backend, with the fewest jobs in flight
  for its size (an agent runs `slots` jobs at once, one per CPU it was given, and queues the rest). The node that ran
  the last job of the same candidate counts one job fewer, as a single host places a job on the GPU that keeps its
  candidate's process (`ToolContext.kept_on`): a compile's candidate is kept for its verify, a verify's for its
  profile, and a job sent elsewhere starts a new process there while the kept one idles (16 of 48 candidates moved
  between nodes on 2x H200, against 6 of 48 between the GPUs of one server; `bench/results`, s22). The agent holds
  its node's CPUs and GPUs as Ray resources while it lives, so Ray places nothing else of KForge there; inside, its
  `ToolContext` queues jobs per device as a single host does: a timing never shares a GPU.
- **A node that dies mid-job** (the agent's actor dies with it: `ActorDiedError`; or Ray's `NodeDiedError`, ...)
  raises `JobLost`, naming the node; the job manager queues the job again once, then fails it, and the dead agent
  is dropped. Ray's own retries stay off (`max_restarts=0`, `max_task_retries=0`): a replayed stream of a job whose
  progress differs from run to run could not say that it ran twice.
- **Cancel:** `ray.cancel` on the call cancels its task in the agent, which cancels the job there; its worker
  processes are killed with their process groups, as on a single host.

Ray is imported only when a fleet is configured (`kforge serve --ray`); without it nothing here runs.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, AsyncIterator

import anyio
import anyio.to_thread
from pydantic import BaseModel

from kforge import __version__
from kforge.backends import Availability

from .context import Progress

from .tool_inputs import RequestError
from .fleet_node import NodeAgent, NodeConfig, replay_writes
from .jobs import JobLost
from .models import sha256_text
from .requests import JobRequest, result_model
from .store import ResultStore

__all__ = ["FleetError", "RayFleet", "import_ray"]

log = logging.getLogger("kforge.fleet")

# A backend no node offered is looked for again (new nodes probed) at most this often (seconds).
_REPROBE_S = 60.0
# How long connecting to the cluster may take before the server gives up (a head answers in about a second).
_CONNECT_TIMEOUT_S = 30.0
# How long a node's agent may take to start and probe its backends (it waits for the node's CPUs and GPUs to be free,
# then probes in a cold worker: seconds, tens on a small busy machine).
_AGENT_START_S = 120.0
# A node whose agent did not start is tried again after this long (seconds).
_REFUSED_S = 600.0
# After ray.cancel, how long to wait for the node to report the task ended (its workers killed).
_CANCEL_WAIT_S = 20.0
# Candidates whose last node is remembered for placement (the oldest forgotten first).
_REMEMBERED_CANDIDATES = 4096


class FleetError(RuntimeError):
    """The fleet cannot be used: Ray is not installed, or the cluster cannot be reached (the message says which)."""


def _lost_errors(ray: ModuleType) -> tuple[type[BaseException], ...]:
    """Ray's errors that mean the node (or the Ray worker process on it) running the job is gone."""
    errors = ray.exceptions
    return (errors.RayActorError, errors.NodeDiedError, errors.WorkerCrashedError, errors.LocalRayletDiedError,
            errors.ObjectLostError)


def import_ray() -> ModuleType:
    """The `ray` module, or a FleetError saying how to install it."""
    # Ray's C++ core would otherwise take SIGTERM first, to print a stack dump as if the server had crashed:
    # read when ray is imported.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray
    except ImportError as exc:
        raise FleetError(f"a Ray fleet (--ray, KFORGE_RAY) needs Ray installed on this host and on every node: "
                         f"pip install 'kforge[ray]' ({exc})") from None
    return ray


class RayFleet:
    """Runs jobs on the Ray cluster at `address` ('auto': the cluster this host joined with `ray start`).

    Use inside `async with fleet.connected():` (the server's lifespan); pass it to `JobManager(executor=...)`."""

    def __init__(self, address: str, node: NodeConfig, store: ResultStore, *, cpus_per_job: float = 1.0) -> None:
        """`store`: the server's, where the nodes' records (results, history, profiles, artifacts) are written."""
        if cpus_per_job <= 0:
            raise ValueError("cpus_per_job must be positive")
        self.address, self.node, self.store, self.cpus_per_job = address, node, store, cpus_per_job
        self._ray: ModuleType | None = None
        self._agent_class: Any = None
        self._agents: dict[str, _Agent] = {}  # node id -> its agent
        self._refused: dict[str, float] = {}  # node id -> when its agent last failed to start
        self._offered: dict[str, Availability] | None = None
        self._probed_at = 0.0
        self._probe_lock = anyio.Lock()
        self._last_node: OrderedDict[tuple[str, str], str] = OrderedDict()  # (backend, candidate sha) -> node id

    @asynccontextmanager
    async def connected(self) -> AsyncIterator[RayFleet]:
        ray = import_ray()

        def connect() -> None:
            # log_to_driver=False: the nodes' output must never reach this process's stdout (the stdio MCP wire).
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.ERROR, namespace="kforge")

        try:
            with anyio.fail_after(_CONNECT_TIMEOUT_S):  # ray.init retries an unreachable head for minutes
                await anyio.to_thread.run_sync(connect, abandon_on_cancel=True)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            why = str(exc) or f"no answer within {_CONNECT_TIMEOUT_S:g} s"
            raise FleetError(f"cannot connect to the Ray cluster at {self.address!r} (--ray, KFORGE_RAY): {why}. "
                             "Start it first (`ray start --head` on one host, `ray start --address=HEAD:6379` on "
                             "the others), or leave --ray out to run jobs on this host") from None
        self._ray = ray
        self._agent_class = ray.remote(max_restarts=0, max_task_retries=0)(NodeAgent)
        log.warning("jobs run on the Ray cluster at %s: %s", self.address, ray.cluster_resources())
        try:
            yield self
        finally:
            await self._stop_agents(ray)
            self._agents.clear()
            self._ray = None
            await anyio.to_thread.run_sync(ray.shutdown)

    # -- JobExecutor -----------------------------------------------------------------------------
    async def require_backend(self, name: str) -> Availability:
        """The backend as the cluster's nodes offer it (probed on each node once); RequestError when none does."""
        found = {a.backend: a for a in await self.availability()}
        if (name not in found or not found[name].ok) and time.monotonic() - self._probed_at > _REPROBE_S:
            found = {a.backend: a for a in await self.availability(fresh=True)}  # a node may have joined since
        if name not in found:
            raise RequestError(f"unknown backend {name!r}; the Ray cluster's nodes know: {', '.join(sorted(found))}")
        if not found[name].ok:
            offered = [a.backend for a in found.values() if a.ok]
            raise RequestError(f"backend {name!r} is not available on any node of the Ray cluster: "
                               f"{found[name].reason}. "
                               f"Available there: {', '.join(offered) or 'none'}")
        return found[name]

    def queue_for(self, avail: Availability) -> str:
        return "Ray cluster"

    async def run(self, request: JobRequest, progress: Progress, *, name: str) -> tuple[BaseModel, str]:
        """Run `request` on a node's agent; its result (written into `store` first) and the node it ran on.

        Raises JobLost when the node died mid-job, RequestError when the node could not serve the request."""
        ray = self._connected()
        code = getattr(request, "candidate_code", None)
        candidate = (request.backend, sha256_text(code)) if code is not None else None
        agent = await self._choose(request.backend, self._last_node.get(candidate) if candidate else None)
        where = f"Ray node {agent.node_id[:12]}"
        stream = agent.actor.run_job.options(name=name, num_returns="streaming").remote(request.model_dump(mode="json"))
        agent.in_flight += 1
        await progress(0.0, None, f"sent to {where}; waiting for one of its {agent.slots} job slots")
        ended = False
        try:
            async for ref in stream:
                event = await ref
                if event.kind == "started":
                    where = f"Ray node {event.node[:12]} ({event.address})"
                    if event.version != __version__:
                        raise RequestError(f"{where} runs kforge {event.version}, this server {__version__}: "
                                           "install the same kforge on every node")
                    await progress(0.0, None, f"running on {where}")
                elif event.kind == "progress":
                    await progress(event.done or 0.0, event.total, f"{event.message} (on {where})")
                elif event.kind == "request_error":
                    ended = True
                    raise RequestError(f"{event.message} (on {where})")
                elif event.kind == "result":
                    ended = True
                    if candidate is not None:
                        self._remember(candidate, agent.node_id)
                    await anyio.to_thread.run_sync(replay_writes, self.store, event.writes)
                    return result_model(request.tool).model_validate(event.result), where
            ended = True
        except ray.exceptions.RayError as exc:
            ended = True
            if isinstance(exc, _lost_errors(ray)):
                self._agents.pop(agent.node_id, None)  # its node is gone: the next job goes elsewhere
                raise JobLost(f"{where} died mid-job (Ray: {type(exc).__name__})") from exc
            if isinstance(exc, ray.exceptions.TaskCancelledError):
                raise JobLost(f"its Ray call on {where} was cancelled from outside KForge") from exc
            cause = getattr(exc, "cause", None) or exc
            raise RuntimeError(f"the job failed on {where}: {type(cause).__name__}: {cause}") from exc
        finally:
            agent.in_flight -= 1
            if not ended:  # cancelled (cancel_job, a server shutdown) or stopped here: stop it there too
                ray.cancel(stream)  # the agent cancels the job's task: the job is cancelled, its workers killed
                with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCEL_WAIT_S):
                    await self._until_ended(stream)
        raise JobLost(f"its Ray call on {where} ended without a result")

    # -- helpers ---------------------------------------------------------------------------------
    def _connected(self) -> ModuleType:
        if self._ray is None:
            raise RuntimeError("the fleet is not connected (enter RayFleet.connected() first)")
        return self._ray

    async def _stop_agents(self, ray: ModuleType) -> None:
        """Each agent ends its pool (its warm workers killed), then goes; one that does not answer in time goes anyway."""
        agents = list(self._agents.values())
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCEL_WAIT_S):
            for agent in agents:
                try:
                    await agent.actor.stop.remote()
                except ray.exceptions.RayError:  # its node is gone already
                    pass
        for agent in agents:
            ray.kill(agent.actor)

    def _remember(self, candidate: tuple[str, str], node_id: str) -> None:
        self._last_node[candidate] = node_id
        self._last_node.move_to_end(candidate)
        while len(self._last_node) > _REMEMBERED_CANDIDATES:
            self._last_node.popitem(last=False)

    async def _choose(self, backend: str, keeps: str | None = None) -> _Agent:
        """The agent, among those whose node offers `backend`, with the fewest jobs in flight per slot, the node that
        `keeps` the candidate's process (ran its last job) counting one job fewer and winning ties; nodes that joined
        since the last look (at most `_REPROBE_S` ago) get their agent first."""
        def offering() -> list[_Agent]:
            return [a for a in self._agents.values() if backend in a.offers]

        # (None offering it: its nodes died, and a node may have joined since.)
        if time.monotonic() - self._probed_at > _REPROBE_S or not offering():
            await self.availability(fresh=True)
        if not (agents := offering()):
            raise JobLost(f"no live Ray node offers the {backend} backend any more")
        def load(a: _Agent) -> tuple[float, bool, int]:
            kept = a.node_id == keeps
            return (a.in_flight - kept) / a.slots, not kept, a.in_flight

        return min(agents, key=load)

    def _agent_for(self, node: dict[str, Any]) -> _Agent:
        """The node's agent, made on first sight: it holds the node's CPUs and GPUs while the server is connected."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = node["NodeID"]
        if node_id not in self._agents:
            cpus, gpus = node["Resources"].get("CPU", 0.0), node["Resources"].get("GPU", 0.0)
            slots = self.node.slots or max(1, int(cpus / self.cpus_per_job))
            config = replace(self.node, slots=slots, threads=max(1, int(self.cpus_per_job)))
            actor = self._agent_class.options(
                name=f"kforge-agent-{node_id[:12]}-{os.getpid()}", num_cpus=cpus, num_gpus=gpus,
                max_concurrency=max(64, 4 * slots),
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(config, cpus)
            self._agents[node_id] = _Agent(node_id=node_id, actor=actor, slots=slots)
        return self._agents[node_id]

    async def _probe_agent(self, ray: ModuleType, agent: _Agent) -> None:
        """Start `agent` and ask what its node offers; an agent that does not start in time (Ray cannot give it the
        node's resources) or whose node died is dropped, and its node not tried again for `_REFUSED_S`."""
        answer, why = None, (f"its agent did not start within {_AGENT_START_S:g} s (are the node's CPUs and GPUs taken "
                             "by other work?)")
        try:
            with anyio.move_on_after(_AGENT_START_S):
                answer = await agent.actor.probe.remote()
        except ray.exceptions.RayError as exc:  # a node that died meanwhile offers nothing
            why = f"it could not be probed ({type(exc).__name__})"
        if answer is None:
            log.warning("Ray node %s runs no KForge jobs for now: %s", agent.node_id[:12], why)
            ray.kill(agent.actor)
            self._agents.pop(agent.node_id, None)
            self._refused[agent.node_id] = time.monotonic()
            return
        agent.probed = [Availability.model_validate(a) for a in answer]
        agent.offers = {a.backend for a in agent.probed if a.ok}

    @staticmethod
    async def _until_ended(stream: Any) -> None:
        try:
            async for ref in stream:
                await ref
        except Exception:  # noqa: BLE001 - TaskCancelledError is the expected end
            pass

    async def availability(self, *, fresh: bool = False) -> list[Availability]:
        """Each backend as the first node that offers it reports it (else the first node's reason); each node's agent
        is made and probed once, and new nodes when `fresh`."""
        ray = self._connected()
        async with self._probe_lock:
            if self._offered is None or fresh:
                nodes = [n for n in ray.nodes()
                         if n["Alive"] and (n["Resources"].get("CPU") or n["Resources"].get("GPU"))]
                if not nodes:
                    raise RequestError(f"the Ray cluster at {self.address!r} has no node with CPUs or GPUs to run jobs")
                alive = {n["NodeID"] for n in nodes}
                for gone in [k for k in self._agents if k not in alive]:
                    self._agents.pop(gone)
                now = time.monotonic()
                agents = [self._agent_for(n) for n in nodes if now - self._refused.get(n["NodeID"], -1e9) > _REFUSED_S]
                async with anyio.create_task_group() as tg:  # new agents start and probe side by side
                    for agent in agents:
                        if agent.probed is None:
                            tg.start_soon(self._probe_agent, ray, agent)
                offered: dict[str, Availability] = {}
                for agent in agents:
                    if agent.probed is None:
                        continue  # it did not start: `_probe_agent` said why
                    for found in agent.probed:
                        if found.backend not in offered or (found.ok and not offered[found.backend].ok):
                            offered[found.backend] = found
                self._offered, self._probed_at = offered, time.monotonic()
            return list(self._offered.values())


@dataclass
class _Agent:
    """The server's view of one node's `NodeAgent`."""

    node_id: str
    actor: Any
    slots: int
    in_flight: int = 0
    probed: list[Availability] | None = None
    offers: set[str] = field(default_factory=set)
