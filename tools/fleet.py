"""The fleet: compile, verify and profile jobs run on a Ray cluster instead of this host.

The server's `JobManager` stays the single owner of job state (the queue, the job store, get_job, cancel_job);
`RayFleet` is only where a job executes. Each job is one Ray task (a streaming generator,
`kforge.tools.fleet_node.run_job_here`) that runs the request through the same tool functions and isolated
worker processes as a single host, on the node's own data directory, and streams back its progress, its result
and the store records it wrote, which are written into the server's store.

- **Resources:** a cpu-backend job reserves `cpus_per_job` CPUs of its node. On a cluster with GPUs, a job of
  another backend reserves a GPU: a whole one to profile (timing never shares a GPU: Ray runs nothing else on
  it meanwhile), `_UNTIMED_GPU_SHARE` of one to compile or verify.
- **A node that dies mid-job** (Ray's `NodeDiedError`, `WorkerCrashedError`, ...) raises `JobLost`, naming the
  node; the job manager queues the job again once, then fails it. Ray's own retry stays off (`max_retries=0`):
  it would replay the stream of a job whose progress differs from run to run, and the job's message could not
  say that it ran twice.
- **Cancel:** `ray.cancel` on the task closes the generator on its node, which cancels the job there; its worker
  processes are killed with their process groups, as on a single host.

Ray is imported only when a fleet is configured (`kforge serve --ray`); without it nothing here runs.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import asynccontextmanager
from types import ModuleType
from typing import Any, AsyncIterator

import anyio
import anyio.to_thread
from pydantic import BaseModel

from kforge import __version__
from kforge.backends import Availability

from .context import Progress

from .tool_inputs import RequestError
from .fleet_node import NodeConfig, probe_node, replay_writes, run_job_here
from .jobs import JobLost
from .requests import JobRequest, result_model
from .store import ResultStore

__all__ = ["FleetError", "RayFleet", "import_ray"]

log = logging.getLogger("kforge.fleet")

# A compile or verify takes this share of a GPU: several build and check at once, and a profile, which asks for
# a whole GPU, waits until none runs there.
_UNTIMED_GPU_SHARE = 0.25
# A backend no node offered is looked for again (new nodes probed) at most this often (seconds).
_REPROBE_S = 60.0
# How long connecting to the cluster may take before the server gives up (a head answers in about a second).
_CONNECT_TIMEOUT_S = 30.0
# After ray.cancel, how long to wait for the node to report the task ended (its workers killed).
_CANCEL_WAIT_S = 20.0


class FleetError(RuntimeError):
    """The fleet cannot be used: Ray is not installed, or the cluster cannot be reached (the message says which)."""


def _lost_errors(ray: ModuleType) -> tuple[type[BaseException], ...]:
    """Ray's errors that mean the node (or the Ray worker process on it) running the job is gone."""
    errors = ray.exceptions
    return (errors.NodeDiedError, errors.WorkerCrashedError, errors.LocalRayletDiedError, errors.ObjectLostError)


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
        self._job: Any = None
        self._probe: Any = None
        self._gpus = False
        self._offered: dict[str, Availability] | None = None
        self._probed_at = 0.0
        self._probe_lock = anyio.Lock()

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
        self._job = ray.remote(num_returns="streaming", max_retries=0)(run_job_here)
        self._probe = ray.remote(max_retries=0)(probe_node)
        self._gpus = ray.cluster_resources().get("GPU", 0) > 0
        log.warning("jobs run on the Ray cluster at %s: %s", self.address, ray.cluster_resources())
        try:
            yield self
        finally:
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
        return f"Ray cluster {'GPUs' if self._takes_gpu(avail.backend) else 'CPUs'}"

    async def run(self, request: JobRequest, progress: Progress, *, name: str) -> tuple[BaseModel, str]:
        """Run `request` as a Ray task; its result (written into `store` first) and the node it ran on.

        Raises JobLost when the node died mid-job, RequestError when the node could not serve the request."""
        ray = self._connected()
        resources = self._resources(request)
        stream = self._job.options(name=name, **resources).remote(self.node, request.model_dump(mode="json"))
        wants = ", ".join(f"{k.removeprefix('num_')} {v:g}" for k, v in resources.items())
        await progress(0.0, None, f"sent to the Ray cluster; waiting for a node with free resources ({wants})")
        where = "a Ray node not yet known"
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
                    await anyio.to_thread.run_sync(replay_writes, self.store, event.writes)
                    return result_model(request.tool).model_validate(event.result), where
            ended = True
        except ray.exceptions.RayError as exc:
            ended = True
            if isinstance(exc, _lost_errors(ray)):
                raise JobLost(f"{where} died mid-job (Ray: {type(exc).__name__})") from exc
            if isinstance(exc, ray.exceptions.TaskCancelledError):
                raise JobLost(f"its Ray task on {where} was cancelled from outside KForge") from exc
            cause = getattr(exc, "cause", None) or exc
            raise RuntimeError(f"the job failed on {where}: {type(cause).__name__}: {cause}") from exc
        finally:
            if not ended:  # cancelled (cancel_job, a server shutdown) or stopped here: stop it there too
                ray.cancel(stream)  # its node closes the generator: the job is cancelled, its workers killed
                with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCEL_WAIT_S):
                    await self._until_ended(stream)
        raise JobLost(f"its Ray task on {where} ended without a result")

    # -- helpers ---------------------------------------------------------------------------------
    def _connected(self) -> ModuleType:
        if self._ray is None:
            raise RuntimeError("the fleet is not connected (enter RayFleet.connected() first)")
        return self._ray

    def _takes_gpu(self, backend: str) -> bool:
        from kforge.backends import backend_class  # the backend's facts, without starting its device

        return self._gpus and getattr(backend_class(backend), "kind", "gpu") == "gpu"

    def _resources(self, request: JobRequest) -> dict[str, float]:
        if self._takes_gpu(request.backend):
            return {"num_cpus": 1.0, "num_gpus": 1.0 if request.tool == "profile_kernel" else _UNTIMED_GPU_SHARE}
        return {"num_cpus": self.cpus_per_job}

    @staticmethod
    async def _until_ended(stream: Any) -> None:
        try:
            async for ref in stream:
                await ref
        except Exception:  # noqa: BLE001 - TaskCancelledError is the expected end
            pass

    async def availability(self, *, fresh: bool = False) -> list[Availability]:
        """Each backend as the first node that offers it reports it (else the first node's reason); the nodes are
        probed once, and again when `fresh`."""
        ray = self._connected()
        async with self._probe_lock:
            if self._offered is None or fresh:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                nodes = [n for n in ray.nodes()
                         if n["Alive"] and (n["Resources"].get("CPU") or n["Resources"].get("GPU"))]
                if not nodes:
                    raise RequestError(f"the Ray cluster at {self.address!r} has no node with CPUs or GPUs to run jobs")
                refs = [self._probe.options(
                    num_cpus=0, num_gpus=_UNTIMED_GPU_SHARE if n["Resources"].get("GPU") else 0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(self.node)
                    for n in nodes]
                offered: dict[str, Availability] = {}
                for node, ref in zip(nodes, refs):
                    try:
                        answer = await ref
                    except ray.exceptions.RayError as exc:  # a node that died meanwhile offers nothing
                        log.warning("Ray node %s could not be probed: %s", node["NodeID"][:12], type(exc).__name__)
                        continue
                    for found in map(Availability.model_validate, answer):
                        if found.backend not in offered or (found.ok and not offered[found.backend].ok):
                            offered[found.backend] = found
                self._offered, self._probed_at = offered, time.monotonic()
                self._gpus = any(n["Resources"].get("GPU") for n in nodes)
            return list(self._offered.values())
