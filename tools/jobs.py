"""Jobs: heavy tool calls run in the server's own task group, not in the request that asked for them.

A tool call submits a request and waits a bounded time, forwarding progress. If the job is not done by
then the caller gets a `JobStatus` handle and fetches the result later with `get_job`, from any
connection: a job outlives the client that started it (desktop clients cancel calls after about 60 s).

- **Queues:** one per accelerator (the backend's device; `cuda` and `triton` share a GPU; each GPU of a
  multi-GPU host is one), bounded: a full queue answers "busy, retry in N s" instead of growing without limit.
  A job of a GPU backend is bound at submission to the GPU it asked for, else to the least loaded one (fewest
  queued and running jobs; `kforge.tools.gpus`).
- **Parallel, fair:** up to `parallel` jobs run at once on each device (builds use the CPU cores; timing still
  takes the device's lock, one at a time), and up to `host_parallel` on the whole host (its cores, by default):
  a second GPU doubles the jobs in flight instead of sharing the first one's slots (one global count held a
  2-GPU H200 host to 1.23x one GPU's throughput, 2026-11-27). The next job goes to the client with the fewest
  running jobs, then the one served least recently: one client's burst does not starve another.
- **Once, and not lost:** a repeated identical request attaches to the job already running it; every job is
  written to the store at submission with its request, and a server that stops leaves its unfinished jobs
  queued for the next server on the same data directory, which claims them atomically and runs them.
- **Cancel:** `cancel` stops a job; its worker processes are killed with their process groups.
- **Where jobs run:** on this host (`LocalExecutor`), or wherever a `JobExecutor` puts them (a Ray cluster:
  `kforge.tools.fleet.RayFleet`); the manager keeps the job's state either way. A job whose machine died under
  it (`JobLost`) is queued again once, then failed, and its message says so.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal, Protocol

import anyio
from pydantic import BaseModel, ConfigDict, Field

from kforge.backends import Availability

from . import gpus
from .context import Progress, ToolContext
from .tool_inputs import RequestError
from .dispatch import run_request
from .requests import JobRequest, parse_request, request_key, result_model
from .process.lifecycle import pid_alive
from .store import ACTIVE_JOB_STATUSES as ACTIVE

__all__ = ["JobExecutor", "JobLost", "JobManager", "JobStatus", "LocalExecutor"]

log = logging.getLogger("kforge.jobs")

_KEEP_FINISHED_S = 30 * 24 * 3600  # finished jobs (and their results) stay fetchable this long
_DEFAULT_JOB_S = 30.0  # a job's expected duration before any has finished
_MAX_CRASH_RETRIES = 1  # a job whose server (or fleet node) died running it is run once more, then failed
_CANCEL_WAIT_S = 20.0  # cancel_job waits this long for a running job's workers to be killed
_PROGRESS_STORE_S = 1.0  # a running job's progress is written to the store at most this often


class JobStatus(BaseModel):
    """Where a job stands, when its result is not ready (or the queue is full)."""

    model_config = ConfigDict(frozen=True)

    status: Literal["queued", "running", "cancelling", "failed", "cancelled", "busy"] = Field(description=(
        "'cancelling': cancel_job was called and the job's workers are being killed."))
    job_id: str | None = Field(default=None, description="Pass to get_job or cancel_job; none when busy.")
    tool: str
    progress: float | None = None
    total: float | None = None
    message: str = ""
    queue_position: int | None = Field(default=None, description="Jobs ahead of this one on its device (queued).")
    retry_after_s: float | None = Field(default=None, description="Busy: try again after about this long.")
    error: str | None = None
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None

    def __str__(self) -> str:
        if self.status == "busy":
            return f"Busy: {self.message} Retry in about {self.retry_after_s:g} s.\nNext: call {self.tool} again then."
        if self.status == "cancelling":
            return (f"Job {self.job_id} ({self.tool}) is being cancelled: {self.message}.\n"
                    f"Next: get_job(job_id=\"{self.job_id}\") confirms it stopped.")
        if self.status in ACTIVE:
            step = f" ({self.progress:g}/{self.total:g})" if self.progress is not None and self.total else ""
            ahead = f", {self.queue_position} job(s) ahead" if self.queue_position else ""
            return (f"Job {self.job_id} ({self.tool}) is {self.status}{ahead}: {self.message}{step}.\n"
                    f"Its result is kept.\nNext: get_job(job_id=\"{self.job_id}\") waits for it.")
        if self.status == "cancelled":
            return (f"Job {self.job_id} ({self.tool}) cancelled: {self.message}.\n"
                    f"Next: call {self.tool} again to run it anew.")
        return f"Job {self.job_id} ({self.tool}) {self.status}: {self.error or self.message}"


class JobLost(Exception):
    """The machine running a job died mid-job (a fleet node); the message names it and says how it was seen."""


class JobExecutor(Protocol):
    """Where jobs run: this host (`LocalExecutor`) or a Ray cluster (`kforge.tools.fleet.RayFleet`)."""

    async def require_backend(self, name: str) -> Availability:
        """The backend where jobs run; RequestError saying why when it is unknown or unavailable there."""

    def queue_for(self, avail: Availability) -> str:
        """The queue (the device) a job of this backend waits in."""

    async def run(self, request: Any, progress: Progress, *, name: str) -> tuple[BaseModel, str]:
        """Run the request; its result and where it ran ('' for this host). JobLost when that machine died."""


class LocalExecutor:
    """Jobs run on this host, in the server's own task group (their workers are this host's processes)."""

    def __init__(self, tools: ToolContext) -> None:
        self.tools = tools

    async def require_backend(self, name: str) -> Availability:
        return await self.tools.require_backend(name)

    def queue_for(self, avail: Availability) -> str:
        return avail.device_name or avail.backend

    async def run(self, request: Any, progress: Progress, *, name: str) -> tuple[BaseModel, str]:
        return await run_request(self.tools, request, progress), ""


@dataclass(eq=False)
class _Job:
    id: str
    request: JobRequest
    key: str
    client: str
    device: str
    created_at: float
    status: str = "queued"
    done: float | None = None
    total: float | None = None
    message: str = "waiting for a free slot"
    started_at: float | None = None
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    cancel_requested: bool = False
    crashes: int = 0  # times the machine running it died (a server, a fleet node)
    lost: list[str] = field(default_factory=list)  # how, for its final message
    scope: anyio.CancelScope | None = None
    changed: anyio.Event = field(default_factory=anyio.Event)

    def touch(self) -> None:
        """Wake everyone waiting on this job (a fresh event for the next change)."""
        event, self.changed = self.changed, anyio.Event()
        event.set()



class JobManager:
    """Runs heavy requests as jobs; use inside `async with manager.running():` (the server's lifespan)."""

    def __init__(self, tools: ToolContext, *, parallel: int = 2, queue_limit: int = 32,
                 max_wait_s: float = 600.0, executor: JobExecutor | None = None,
                 host_parallel: int | None = None) -> None:
        if host_parallel is None:
            host_parallel = max(parallel, os.cpu_count() or 1)
        if parallel < 1 or queue_limit < 1 or host_parallel < 1:
            raise ValueError("parallel, host_parallel and queue_limit must be at least 1")
        self.tools, self.store = tools, tools.store
        self.executor: JobExecutor = executor or LocalExecutor(tools)
        self.parallel, self.queue_limit, self.max_wait_s = parallel, queue_limit, max_wait_s
        self.host_parallel = host_parallel
        self._running_per_device: Counter[str] = Counter()
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._jobs: dict[str, _Job] = {}
        self._pending: list[_Job] = []
        self._running_per_client: Counter[str] = Counter()
        self._last_start: dict[str, float] = {}
        self._mean_s: dict[str, float] = {}
        self._wakeup = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None

    # -- lifetime --------------------------------------------------------------------------------
    @asynccontextmanager
    async def running(self) -> AsyncIterator[JobManager]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self.store.prune_jobs(_KEEP_FINISHED_S)
            self._resume_orphans()
            tg.start_soon(self._dispatch, tg)
            try:
                yield self
            finally:
                self._tg = None
                tg.cancel_scope.cancel()  # running jobs go back to "queued" in the store (see _execute)

    def _resume_orphans(self) -> None:
        """Claim the unfinished jobs of servers that are gone, and queue them again (oldest first)."""
        host = socket.gethostname()
        for row in self.store.jobs(statuses=ACTIVE, limit=10_000):
            owner_host, _, pid = row["owner"].rpartition(":")
            if owner_host != host or (pid.isdigit() and pid_alive(int(pid))):
                continue  # another live server's job (or another machine's): not ours to run
            if row["status"] == "running" and row.get("crashes", 0) >= _MAX_CRASH_RETRIES:
                # Its server died while running it, again: the job may be what kills servers. Not run a third time.
                self.store.update_job(row["job_id"], expect_owner=row["owner"], owner=self.owner, status="failed",
                                      finished_at=time.time(), crashes=row["crashes"] + 1, message="failed",
                                      error=f"the server died while running this job {row['crashes'] + 1} times (it was "
                                            f"retried {_MAX_CRASH_RETRIES} time(s)); it is not run again. If the "
                                            "server's log shows no other cause, the job itself brings the server down")
                log.warning("job %s failed: its server died while running it %d times", row["job_id"], row["crashes"] + 1)
                continue
            crashed = row["status"] == "running"  # a graceful stop puts its jobs back in "queued"
            if not self.store.update_job(
                    row["job_id"], expect_owner=row["owner"], owner=self.owner, status="queued",
                    crashes=row.get("crashes", 0) + crashed,
                    message="resumed: the server running it died; if it dies again while running it, the job fails"
                    if crashed else "resumed: the server that accepted it stopped before it finished"):
                continue  # another server claimed it first
            job = _Job(id=row["job_id"], request=parse_request(row["request"]), key=row["key"], client=row["client"],
                       device=row["device"], created_at=row["created_at"], message=row["message"] or "",
                       crashes=row.get("crashes", 0) + crashed)
            self._jobs[job.id] = job
            self._pending.append(job)
            log.info("resumed job %s (%s)", job.id, job.request.tool)
        self._wakeup.set()

    # -- submit, wait, read, cancel --------------------------------------------------------------
    async def submit(self, request: JobRequest, client: str) -> _Job | JobStatus:
        """Queue `request` (or attach to the identical job already queued or running); `busy` when full."""
        if self._tg is None:
            raise RuntimeError("the job manager is not running (enter JobManager.running() first)")
        avail = await self.executor.require_backend(request.backend)  # unknown backends fail here, at once
        key = request_key(request)
        for job in self._jobs.values():
            if job.key == key and job.status in ACTIVE:
                return job
        request, device = self._place(avail, request)
        queued = [j for j in self._pending if j.device == device]
        if len(queued) >= self.queue_limit:
            return JobStatus(status="busy", tool=request.tool, retry_after_s=self._estimate_wait(queued),
                             message=f"{len(queued)} jobs are queued for {device} (the limit is {self.queue_limit}).")
        job = _Job(id=uuid.uuid4().hex[:16], request=request, key=key, client=client, device=device,
                   created_at=time.time())
        self.store.insert_job({"job_id": job.id, "key": key, "tool": request.tool, "backend": request.backend,
                               "client": client, "device": device, "owner": self.owner, "status": "queued",
                               "request": request.model_dump(mode="json"), "created_at": job.created_at,
                               "message": job.message})
        self._jobs[job.id] = job
        self._pending.append(job)
        self._wakeup.set()
        return job

    async def wait(self, job: _Job, wait_s: float, progress: Progress) -> BaseModel:
        """Wait up to `wait_s` (at most `max_wait_s`) for `job`, forwarding its progress; its result, or its status."""
        sent = None
        with anyio.move_on_after(min(wait_s, self.max_wait_s)):
            while True:
                changed = job.changed
                view = (job.done, job.total, self._message(job))
                if view != sent and (job.done is not None or job.status == "queued"):
                    await progress(job.done or 0.0, job.total, view[2])  # the last one too ("done")
                    sent = view
                    continue  # the job may have moved on (even finished) while this went out: look again
                if job.status not in ACTIVE:
                    break
                await changed.wait()
        return self.view(job.id)

    async def wait_for(self, job_id: str, wait_s: float, progress: Progress) -> BaseModel:
        """`get_job`: the result of `job_id`, waiting up to `wait_s` for a job this server runs."""
        job = self._jobs.get(job_id)
        if job is not None:
            return await self.wait(job, wait_s, progress)
        return self.view(job_id)

    def view(self, job_id: str) -> BaseModel:
        """The job's result (the tool's own result model) when done, else its `JobStatus`."""
        job = self._jobs.get(job_id)
        row = self._row(job) if job is not None else self.store.get_job(job_id)
        if row is None:
            raise RequestError(f"no job {job_id!r} on this server: job ids come from a tool's job handle, and "
                               "finished jobs are kept for 30 days (resource kforge://jobs lists recent ones)")
        if row["status"] == "done":
            return result_model(row["tool"]).model_validate(row["result"])
        position = self._ahead(job) if job is not None and job.status == "queued" else None
        if job is not None and job.cancel_requested and row["status"] in ACTIVE:
            row = {**row, "status": "cancelling", "message": "cancel requested; its worker processes are being killed"}
        return JobStatus(status=row["status"], job_id=row["job_id"], tool=row["tool"], progress=row["done"],
                         total=row["total"], message=row["message"] or "", queue_position=position,
                         error=row["error"], created_at=row["created_at"], started_at=row["started_at"],
                         finished_at=row["finished_at"])

    def cancel(self, job_id: str) -> BaseModel:
        job = self._jobs.get(job_id)
        if job is None or job.status not in ACTIVE:
            return self.view(job_id)  # unknown (raises), or finished already: say how it ended
        job.cancel_requested = True
        if job.status == "queued":
            self._pending.remove(job)
            self._finish(job, "cancelled", message="cancelled before it started")
        elif job.scope is not None:
            job.scope.cancel()  # _execute records it once the workers are killed
        return self.view(job_id)

    async def cancel_and_wait(self, job_id: str, wait_s: float = _CANCEL_WAIT_S) -> BaseModel:
        """`cancel_job`: cancel, then wait (up to `wait_s`) until the workers are gone, so the answer says
        'cancelled' (or the result, when the job finished first), not 'running'."""
        answer = self.cancel(job_id)
        job = self._jobs.get(job_id)
        if job is None:
            return answer
        with anyio.move_on_after(wait_s):
            while job.status in ACTIVE:
                await job.changed.wait()
        return self.view(job_id)

    def recent(self, limit: int = 50) -> list[dict[str, Any]]:
        """The latest jobs from the store, those this server runs as they are now (the store's copy of a running
        job's progress is written at most once a second)."""
        keep = ("job_id", "tool", "backend", "client", "device", "status", "message", "error", "created_at",
                "started_at", "finished_at")
        rows = []
        for r in self.store.jobs(limit=limit):
            if (job := self._jobs.get(r["job_id"])) is not None:
                r = {**r, **self._row(job)}
            rows.append({k: r[k] for k in keep})
        return rows

    # -- scheduling ------------------------------------------------------------------------------
    async def _dispatch(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            job = self._pick()
            if job is None:  # nothing queued, or no free slot where something is: wait for a submit or an end
                self._wakeup = anyio.Event()
                await self._wakeup.wait()
                continue
            self._pending.remove(job)
            self._running_per_device[job.device] += 1
            tg.start_soon(self._execute, job)

    def _pick(self) -> _Job | None:
        """Among the queued jobs whose device has a free slot (while the host has one): the client with the fewest
        running jobs, then the one served least recently."""
        if sum(self._running_per_device.values()) >= self.host_parallel:
            return None
        ready = [j for j in self._pending if self._running_per_device[j.device] < self.parallel]
        return min(ready, key=lambda j: (self._running_per_client[j.client], self._last_start.get(j.client, 0.0),
                                         j.created_at), default=None)

    async def _execute(self, job: _Job) -> None:
        now = time.time()
        self._running_per_client[job.client] += 1
        self._last_start[job.client] = time.monotonic()
        job.status, job.started_at, job.message = "running", now, "started"
        self.store.update_job(job.id, status="running", started_at=now, message=job.message)
        job.touch()

        stored_at = 0.0

        async def progress(done: float, total: float | None, message: str) -> None:
            nonlocal stored_at
            job.done, job.total, job.message = done, total, message
            # This server's waiters read the job itself; the store's copy (other servers' get_job, a restart)
            # is written at most once a second: a verify reports a dozen steps, each a commit on the event loop.
            if time.monotonic() - stored_at >= _PROGRESS_STORE_S:
                self.store.update_job(job.id, done=done, total=total, message=message)
                stored_at = time.monotonic()
            job.touch()

        try:
            with anyio.CancelScope() as scope:
                job.scope = scope
                if job.cancel_requested:
                    scope.cancel()
                result, where = await self.executor.run(job.request, progress,
                                                        name=f"kforge {job.request.tool} {job.id}")
            if job.cancel_requested:
                self._finish(job, "cancelled", message="cancelled while running; its worker processes were killed")
            else:
                done = "; ".join(["done" + (f" on {where}" if where else ""), *job.lost])
                self._finish(job, "done", message=done, result=result.model_dump(mode="json", exclude_none=True))
        except anyio.get_cancelled_exc_class():
            # The server is stopping: the job goes back to the queue for the next server on this data directory.
            job.status = "queued"
            self.store.update_job(job.id, status="queued", message="interrupted by a server shutdown; "
                                  "the next server on this data directory resumes it")
            raise
        except JobLost as exc:
            self._lost(job, str(exc))
        except RequestError as exc:
            self._finish(job, "failed", message="failed", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a harness bug must not take the job manager down
            log.exception("job %s (%s) failed", job.id, job.request.tool)
            self._finish(job, "failed", message="failed",
                         error=f"KForge internal error ({type(exc).__name__}: {exc}); the server log has the traceback")
        finally:
            self._running_per_client[job.client] -= 1
            self._running_per_device[job.device] -= 1
            self._wakeup.set()

    def _lost(self, job: _Job, how: str) -> None:
        """The machine running `job` died: queue it again (the first time), else fail it; either way, say why."""
        job.crashes += 1
        log.warning("job %s (%s): %s", job.id, job.request.tool, how)
        if job.cancel_requested:
            self._finish(job, "cancelled", message=f"cancelled; meanwhile {how}")
            return
        if job.crashes > _MAX_CRASH_RETRIES:
            self._finish(job, "failed", message="failed", error=(
                f"{how}; the machines running this job died {job.crashes} times (it was re-queued "
                f"{_MAX_CRASH_RETRIES} time(s)), so it is not run again. Call {job.request.tool} again to retry; "
                "if it keeps happening, the job itself may bring the machines down"))
            self.store.update_job(job.id, crashes=job.crashes)
            return
        job.lost.append(f"re-queued once after {how}")
        job.status, job.done, job.total = "queued", None, None
        job.message = f"re-queued: {how}; it runs again from the start (if its machine dies again, the job fails)"
        self.store.update_job(job.id, status="queued", crashes=job.crashes, message=job.message, done=None, total=None)
        self._pending.append(job)
        self._wakeup.set()
        job.touch()

    def _finish(self, job: _Job, status: str, *, message: str, result: dict[str, Any] | None = None,
                error: str | None = None) -> None:
        job.status, job.message, job.result, job.error, job.finished_at = status, message, result, error, time.time()
        self.store.update_job(job.id, status=status, message=message, result=result, error=error,
                              finished_at=job.finished_at)
        if status == "done" and job.started_at is not None:
            tool, took = job.request.tool, job.finished_at - job.started_at
            self._mean_s[tool] = took if tool not in self._mean_s else 0.7 * self._mean_s[tool] + 0.3 * took
        job.touch()
        self._jobs.pop(job.id, None)  # finished jobs are read from the store

    # -- helpers ---------------------------------------------------------------------------------
    def _place(self, avail: Availability, request: JobRequest) -> tuple[JobRequest, str]:
        """The request bound to one GPU of this host (the one it names, else the least loaded), and its queue.

        Only on this host: a fleet's nodes place their own jobs (Ray hands each task its GPU)."""
        if not isinstance(self.executor, LocalExecutor) or not avail.gpus:
            if getattr(request, "gpu", None) is not None and not avail.gpus:
                gpus.choose_gpu(avail, request.gpu, lambda p: 0)  # says why a GPU cannot be asked for here
            return request, self.executor.queue_for(avail)
        load = Counter(j.device for j in self._jobs.values() if j.status in ACTIVE)
        placement = gpus.choose_gpu(avail, getattr(request, "gpu", None), lambda p: load[gpus.device_key(avail, p)],
                                    self.tools.kept_on(request.backend, getattr(request, "candidate_code", None)))
        return request.model_copy(update={"gpu": placement.gpu.index}), gpus.device_key(avail, placement)

    def _estimate_wait(self, queued: list[_Job]) -> float:
        """About when a slot frees for a new job: the queued jobs' expected time over the device's parallel slots."""
        expected = sum(self._mean_s.get(j.request.tool, _DEFAULT_JOB_S) for j in queued)
        return float(min(600, max(1, round(expected / self.parallel))))

    def _ahead(self, job: _Job) -> int:
        """Queued jobs for the same device submitted before `job`."""
        return sum(1 for j in self._pending if j.device == job.device and j.created_at < job.created_at)

    def _message(self, job: _Job) -> str:
        if job.status != "queued":
            return job.message
        where = f"queued for {job.device}: {self._ahead(job)} job(s) ahead"
        return f"{job.lost[-1]}; {where}" if job.lost else where

    def _row(self, job: _Job) -> dict[str, Any]:
        return {"job_id": job.id, "tool": job.request.tool, "status": job.status, "done": job.done,
                "total": job.total, "message": self._message(job), "error": job.error, "result": job.result,
                "created_at": job.created_at, "started_at": job.started_at, "finished_at": job.finished_at}
