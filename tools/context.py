"""What every tool function needs from its caller: data directory, store, limits, device locks.

Built once by the server from its settings and passed down; nothing below reads the environment.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import time
from contextlib import asynccontextmanager, contextmanager
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import anyio

from kforge.backends import Availability, DeviceFacts, backend_class, backend_names

from . import gpus
from .tool_inputs import DEFAULT_BUDGET_S, RequestError
from .device_use import DeviceUse
from .models import sha256_text
from .process.pool import WorkerPool
from .process.protocol import CeilingsRequest, ProbeRequest
from .process.runner import WorkerProcess
from .process.bytecode import ensure_bytecode
from .process.lifecycle import pid_alive, scratch_name, SCRATCH_OWNER, trace, traced
from .process.limits import sandbox_args, WorkerLimits
from .store import ResultStore

__all__ = ["Progress", "ToolContext", "no_progress", "scratch_name",
           "sweep_leftovers"]

log = logging.getLogger("kforge.context")


Progress = Callable[[float, float | None, str], Awaitable[None]]


async def no_progress(done: float, total: float | None, message: str) -> None:
    return None



# Directories of an older layout, whose names say no owner, are left this long (no job runs for a day).
_UNOWNED_KEEP_S = 24 * 3600


def sweep_leftovers(jobs: Path) -> list[str]:
    """Remove the scratch directories (`jobs/*`, the warm workers' `jobs/w-*` too) of servers of this host that
    are gone: a server killed or crashed mid-job never removed them. Directories of live servers, of other
    hosts (a shared data directory) and, in an older layout, younger than a day are left. Returns the names."""
    try:
        entries = list(jobs.iterdir())
    except OSError:
        return []
    host, removed = socket.gethostname(), []
    for entry in entries:
        owner = SCRATCH_OWNER.search(entry.name)
        try:
            if owner:
                if owner.group(2) != host or pid_alive(int(owner.group(1))):
                    continue
            elif time.time() - entry.lstat().st_mtime < _UNOWNED_KEEP_S:
                continue
            if not os.path.lexists(entry):  # a warm worker's directory, removed with the job that linked it
                removed.append(entry.name)
                continue
            if entry.is_dir() and not entry.is_symlink():
                remove_scratch(entry, jobs)
            else:
                entry.unlink()
        except OSError:
            continue
        removed.append(entry.name)
    if removed:
        log.info("removed %d scratch directories of servers that are gone", len(removed))
    return removed


def remove_scratch(path: Path, jobs: Path) -> None:
    """Remove a job's scratch directory with the warm workers' own directories its roles link to (`jobs/w-*`,
    `kforge.tools.process.pool`): removing the links alone would leave their files behind."""
    try:
        entries = list(path.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        if entry.is_symlink():
            target = entry.resolve()
            if target.parent == jobs.resolve():
                shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class ToolContext:
    home: Path
    limits: WorkerLimits = field(default_factory=WorkerLimits)
    keep_scratch: bool = False
    store: ResultStore = field(init=False)
    _device_uses: dict[str, DeviceUse] = field(default_factory=dict, init=False)
    _availability: list[Availability] | None = field(default=None, init=False)
    _probe_lock: anyio.Lock = field(default_factory=anyio.Lock, init=False)
    _probe_waiters: int = field(default=0, init=False)  # jobs waiting for the first probe's answer
    worker_network: str = field(default="unknown", init=False)  # what the probe worker reported
    worker_isolation: dict[str, list[str]] = field(default_factory=dict, init=False)  # its sandbox: applied, missing
    #: warm workers, while a server runs the pool (`kforge.tools.process.pool`); None: every worker starts cold
    pool: WorkerPool | None = field(default=None, init=False)
    #: baseline timings by (reference, baseline, budget, environment): (when measured, the judge's reply)
    baseline_timings: dict[tuple[str, ...], tuple[float, dict[str, Any]]] = field(default_factory=dict, init=False)
    #: `device_facts`, per backend and GPU (its uuid; "" for one GPU or none)
    _facts: dict[tuple[str, str], DeviceFacts] = field(default_factory=dict, init=False)
    _facts_locks: dict[tuple[str, str], anyio.Lock] = field(default_factory=lambda: defaultdict(anyio.Lock), init=False)
    #: tool calls running on each GPU (by uuid or index), for placing a direct call (`on_gpu`); jobs are placed by
    #: the job manager, which counts its queued and running jobs
    _gpu_calls: Counter[str] = field(default_factory=Counter, init=False)
    #: where a problem's torch.compile baseline is compiled ahead, beside its first candidate's compile or verify
    #: (`kforge.tools.warmup`): "gpu" backends only (the compile takes host cores a CPU backend's trials use),
    #: "all", or "off"; "gpu" by default (with an agent's turn before the profile it hides the compile: README)
    warm_baselines: str = "gpu"
    #: whether a warm-up also times the baseline it compiled, and eager beside it, once the compile is done (alone on
    #: the device, as any timing), for a profile with `timing_budget_s` (the server's default budget) to reuse
    warm_timing: bool = True
    timing_budget_s: float = DEFAULT_BUDGET_S
    #: whether a profile adds a torch.compile baseline still compiling ahead after it answers (`late_baselines`,
    #: `profile._late_warmup`) instead of waiting for it; off on a fleet node, whose profiles the head keeps
    late_baselines: bool = True
    #: warm workers forked at once by the pool (`WorkerPool.max_forks`; 0: no limit)
    max_forks: int = 0
    #: the warm-ups under way, by the key their judge is kept under (`steps.warm_key`): set when each ends
    warmups: dict[tuple[str, ...], Any] = field(default_factory=dict, init=False)  # `warmup.Warmup`s
    #: the server's task group for work no call waits for (warm-ups), while `warm_workers` runs
    background: anyio.abc.TaskGroup | None = field(default=None, init=False)
    #: whose device's ceilings are measured in the background after a verify, for the profile that likely follows
    #: (`measure_facts_ahead`): "gpu" backends (the default), "all", or "off"
    facts_ahead: str = "gpu"
    #: whether those ceilings are also measured as soon as a fresh server's pool is warm, if no job came yet (during
    #: the agent's first turn: `warm_workers`)
    facts_at_start: bool = True
    _facts_ahead: set[tuple[str, str]] = field(default_factory=set, init=False)  # keys being measured ahead

    def worker(self, backend: str, scratch: Path, role: str, *, extra_env: dict[str, str] | None = None,
               **kwargs: Any) -> WorkerProcess:
        """A worker for one job (warm from the pool when one is ready), pinned to the job's GPU (`kforge.tools.gpus`)."""
        env = {**gpus.pin_env(gpus.current()), **(extra_env or {})} or None
        return WorkerProcess(backend=backend, home=self.home, scratch=scratch, limits=self.limits, role=role,
                             pool=self.pool, extra_env=env, place=gpus.pin_key(gpus.current()), **kwargs)

    @asynccontextmanager
    async def on_gpu(self, backend: str, gpu: int | None, candidate_code: str | None = None,
                     ) -> AsyncIterator[gpus.Placement | None]:
        """Run the block on GPU `gpu` of the backend, or the least loaded one (None for a CPU backend), one that keeps
        a process of `candidate_code` counting as less loaded: the workers it starts are pinned there, and its device
        lock, ceilings and baselines are that GPU's."""
        avail = await self.require_backend(backend)
        placement = gpus.choose_gpu(avail, gpu, lambda p: self._gpu_calls[gpus.gpu_id(p.gpu)],
                                    self.kept_on(backend, candidate_code))
        if placement is not None:
            self._gpu_calls[gpus.gpu_id(placement.gpu)] += 1
        try:
            with gpus.placed_on(placement):
                yield placement
        finally:
            if placement is not None:
                self._gpu_calls[gpus.gpu_id(placement.gpu)] -= 1

    def kept_on(self, backend: str, candidate_code: str | None) -> Callable[[gpus.Placement], bool]:
        """Whether a placement's GPU keeps a process of `candidate_code` (its compile's or verify's candidate, kept or
        being reset): a job placed there needs no new process. One placed elsewhere forks one, whose device
        context start stalls the driver's allocations host-wide (`bench/results`, s17), and the kept one idles."""
        kept = (self.pool.kept_pins("candidate", backend, sha256_text(candidate_code))
                if self.pool is not None and candidate_code is not None else set())
        return lambda p: gpus.pin_key(p) in kept

    def device_key(self, avail: Availability) -> str:
        """The device the running call times on: its GPU where the host has several (`device_use`)."""
        return gpus.device_key(avail, gpus.current())

    def __post_init__(self) -> None:
        self.home = Path(self.home).expanduser().resolve()
        self.store = ResultStore(self.home)

    @asynccontextmanager
    async def warm_workers(self, size: int) -> AsyncIterator[WorkerPool]:
        """Keep `size` warm workers per available backend while the block runs (a server's lifetime)."""
        pool = WorkerPool(self.home, size=size, isolate_network=self.limits.isolate_network, max_forks=self.max_forks,
                          sandbox=sandbox_args(self.home, self.limits), trace_file=self.limits.trace_file)

        def want_all(group: list[Availability]) -> None:
            for avail in group:
                for env in warm_kinds(avail):
                    pool.want(avail.backend, env)

        async def want_available() -> None:
            try:
                ready = [avail for avail in await self.availability() if avail.ok]
                # On a GPU host the GPU kinds start first, and the CPU kinds once those are idle: a GPU host's first
                # jobs are rarely on its CPU, and a CPU kind's fork server and forks (their first comparison runs on
                # every core) took the host's cores while the GPU kinds started (s24, 2x H200: the cpu forks' warm-up
                # took 4.8 s while the first verify on cuda waited 8.2 s for its workers).
                gpu_host = any(avail.kind == "gpu" for avail in ready)
                first = [avail for avail in ready if avail.kind == "gpu" or not gpu_host]
                want_all(first)
                later = [avail for avail in ready if avail not in first]
                ahead = [avail for avail in first if self.facts_at_start and self._facts_wanted(avail)]
                if later or ahead:
                    with anyio.move_on_after(_OTHER_KINDS_AFTER_S):
                        while not pool.settled():
                            await anyio.sleep(0.2)
                # The ceilings, during the agent's first turn: measured after the first verify instead, they waited
                # for its workers' refills and were 1.6 s of the first profile (level2/80 after a 10 s turn, H200,
                # s36). Not once a job took workers: it goes first, and its verify measures them ahead.
                if ahead and pool.settled() and not pool.served:
                    for avail in ahead:
                        for placement in gpus.placements(avail) or [None]:
                            with gpus.placed_on(placement):
                                self.measure_facts_ahead(avail)
                if later:
                    want_all(later)
            except Exception:  # noqa: BLE001 - a failed probe is reported by the first tool call
                pass

        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            self.pool, self.background = pool, tg
            if size > 0:
                tg.start_soon(want_available)
            try:
                yield pool
            finally:
                self.pool = self.background = None
                tg.cancel_scope.cancel()

    def sandbox_warnings(self) -> list[str]:
        """What of the workers' sandbox this host refused, as the results' warnings (degrade loudly)."""
        missing = self.worker_isolation.get("missing", [])
        return [f"the workers' sandbox is incomplete on this host: {'; '.join(missing)}"] if missing else []

    def hold_forks(self, light: bool = False) -> Callable[[], None]:
        """Keep the pool from starting forks until the returned release is called (`WorkerPool.hold_forks`)."""
        return self.pool.hold_forks(light) if self.pool is not None else (lambda: None)

    def pause_forks(self, light: bool = False) -> None:
        """Stop the warm workers being readied until the holds are released: nothing else readies a device beside
        a timing (`WorkerPool.pause_forks`)."""
        if self.pool is not None:
            self.pool.pause_forks(light)

    def device_use(self, device: str) -> DeviceUse:
        """Who uses the device: correctness runs together, a timing alone (`kforge.tools.device_use`); builds take
        nothing. Keyed by the physical device (`device_key`: each GPU of a multi-GPU host, else
        `Availability.device_name`), not the backend: `cuda` and `triton` share one GPU."""
        return self._device_uses.setdefault(device, DeviceUse())

    @contextmanager
    def scratch(self, tool: str) -> Iterator[Path]:
        path = self.home / "jobs" / scratch_name(f"{time.strftime('%Y%m%d-%H%M%S')}-{tool}")
        path.mkdir(parents=True)
        try:
            yield path
        finally:
            if not self.keep_scratch:
                with traced("server", f"{tool}.scratch_removed", to=self.limits.trace_file):
                    remove_scratch(path, self.home / "jobs")

    async def availability(self, job: bool = False) -> list[Availability]:
        """Probe every known backend once, in a worker (the server itself never imports torch). `job`: the caller
        is a job that asks for workers next (`require_backend`), not a listing."""
        first = job and self._availability is None
        self._probe_waiters += first
        try:
            return await self._probed()
        finally:
            self._probe_waiters -= first

    async def _probed(self) -> list[Availability]:
        async with self._probe_lock:
            if self._availability is None:
                started = time.perf_counter()
                done = await anyio.to_thread.run_sync(ensure_bytecode, self.home)  # before the first worker
                if done is not None:
                    trace("server", "bytecode", True, started, to=self.limits.trace_file, **done)
                pool = self.pool
                prestarted = first_kinds_here() if pool is not None else []
                for name in prestarted:  # their imports beside the probe's (`WorkerPool.prestart`)
                    pool.prestart(name)
                with self.scratch("probe") as scratch:
                    async with WorkerProcess(backend="", home=self.home, scratch=scratch, limits=self.limits,
                                             role="probe") as w:
                        reply = await w.call(ProbeRequest(backends=backend_names()), stage="probe", timeout_s=120)
                        self.worker_network, self.worker_isolation = w.network, w.isolation
                self._availability = list(reply.backends)
                found = {a.backend for a in self._availability if a.ok}
                for name in (n for n in prestarted if n not in found):
                    await pool.drop_zygote(name)
                # A job waited for it: its forks go first. A listing (list_backends, doctor) asks for no worker, and
                # deferring the refills for it left a fresh server idle for 2 s before its first verify (s26: the
                # KernelBench sample's list_backends, then the verify 2.4 s after the probe, its forks cold).
                if pool is not None and self._probe_waiters:
                    pool.defer_refills(_JOB_FIRST_AFTER_PROBE_S)
            return self._availability

    async def device_facts(self, backend: str, *, remeasure: bool = False,
                           placement: gpus.Placement | None = None) -> DeviceFacts:
        """The device's facts with measured ceilings (measured once per device, then cached on disk and here).

        The device: `placement`'s GPU, else the running call's (`on_gpu`), else the backend's one device.
        Measured by a worker of its own, never a candidate's: a candidate could report low ceilings and so
        place itself near the roofline (and a profile would pay the 0.3 s measurement each time)."""
        placement = placement or gpus.current()
        key = _facts_key(backend, placement)
        async with self._facts_locks[key]:
            if remeasure or key not in self._facts:
                with gpus.placed_on(placement):
                    self._facts[key] = await self._measure_facts(backend, remeasure)
            return self._facts[key]

    def measure_facts_ahead(self, avail: Availability) -> bool:
        """After a verify on the running call's device (or on a fresh server, during the agent's first turn:
        `warm_workers`): measure its ceilings in the background when they are not known yet, in the next warm worker
        to come idle, so that the profile that likely follows finds them (a new data directory's first profile spent
        0.36 s measuring them, an H200, s28). Never starts a cold worker;
        where none comes idle, or a profile asks first, the profile measures them as before. Returns whether it
        started."""
        placement = gpus.current()
        key = _facts_key(avail.backend, placement)
        if self.background is None or self.pool is None or not self._facts_wanted(avail) or key in self._facts \
                or key in self._facts_ahead:
            return False
        self._facts_ahead.add(key)
        self.background.start_soon(self._facts_in_background, avail.backend, placement, key)
        return True

    def _facts_wanted(self, avail: Availability) -> bool:
        """Whether `avail`'s ceilings are measured ahead (`facts_ahead`)."""
        return self.facts_ahead == "all" or (self.facts_ahead == "gpu" and avail.kind == "gpu")

    async def _facts_in_background(self, backend: str, placement: gpus.Placement | None, key: tuple[str, str]) -> None:
        started, outcome = time.perf_counter(), "measured"
        try:
            with gpus.placed_on(placement):
                # The facts' lock only once a worker is here: a profile asking meanwhile measures them itself.
                async with self._ceilings_worker(backend, warm_only=True) as worker, self._facts_locks[key]:
                    if key in self._facts:
                        outcome = "a profile measured them first"
                        return
                    self._facts[key] = await self._facts_from(worker, backend, remeasure=False)
        except Exception as exc:  # noqa: BLE001 - a head start, never a job (no idle worker, a failure)
            outcome = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            self._facts_ahead.discard(key)
            trace("server", "ceilings.ahead", True, started, to=self.limits.trace_file, outcome=outcome)

    def measured_gpus(self, avail: Availability) -> Availability:
        """`avail` with each GPU's ceilings where they were measured (the cache `device_facts` fills)."""
        torch = avail.versions.get("torch", "")
        listed = []
        for gpu in avail.gpus:
            uuid = gpus.gpu_id(gpu) if len(avail.gpus) > 1 else None  # one GPU: cached per device model, as before
            path = self.home / "cache" / "ceilings" / gpus.ceilings_name(avail.backend, gpu.name, torch, uuid)
            try:
                listed.append(gpu.model_copy(update=json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                listed.append(gpu)
        return avail.model_copy(update={"gpus": listed})

    async def _measure_facts(self, backend: str, remeasure: bool) -> DeviceFacts:
        async with self._ceilings_worker(backend) as worker:
            return await self._facts_from(worker, backend, remeasure)

    @asynccontextmanager
    async def _ceilings_worker(self, backend: str, *, warm_only: bool = False) -> AsyncIterator[WorkerProcess]:
        """A worker of its own for measuring the ceilings of the running call's device."""
        with self.scratch("ceilings") as scratch:
            # A role's own folder under the job's, as every job gives its workers: a worker is taken from the pool only
            # for a folder not yet made (the job's own, made by `scratch`, started a cold worker: 2.5-4 s of a new
            # data directory's first profile on an H200, s24).
            async with self.worker(backend, scratch / "ceilings", "ceilings", warm_only=warm_only) as worker:
                yield worker

    async def _facts_from(self, w: WorkerProcess, backend: str, remeasure: bool) -> DeviceFacts:
        """The device's facts from the ceilings worker `w`, measured alone on the device (its timing use)."""
        avail = await self.require_backend(backend)
        gpu = _facts_key(backend, gpus.current())[1] or None  # a pinned GPU's id, else None
        async with self.device_use(self.device_key(avail)).timing():
            release = self.hold_forks()  # as a timing: the refill of its own worker's take readies a device else
            self.pause_forks()
            try:
                reply = await w.call(CeilingsRequest(remeasure=remeasure, gpu=gpu), stage="ceilings")
            finally:
                release()
        if reply.failure is not None or reply.facts is None:
            raise RequestError(f"the device's ceilings could not be measured: {reply.failure}")
        stored = reply.to_store  # measured by a worker of its own (no candidate's): the cache is read-only there
        if isinstance(stored, dict) and re.fullmatch(r"[A-Za-z0-9-]{1,200}\.json", str(stored.get("name"))):
            (self.home / "cache" / "ceilings").mkdir(parents=True, exist_ok=True)
            (self.home / "cache" / "ceilings" / stored["name"]).write_text(json.dumps(stored.get("ceilings")))
        return reply.facts

    async def require_backend(self, name: str) -> Availability:
        found = {a.backend: a for a in await self.availability(job=True)}
        if name not in found:
            raise RequestError(f"unknown backend {name!r}; this server knows: {', '.join(sorted(found))}")
        if not found[name].ok:
            offered = [a.backend for a in found.values() if a.ok]
            raise RequestError(f"backend {name!r} is not available on this host: {found[name].reason}. "
                               f"Available here: {', '.join(offered) or 'none'}")
        return found[name]

    async def environment(self, backend: str) -> dict[str, str]:
        """Versions that make a stored result stale when they change."""
        from kforge import __version__

        avail = await self.require_backend(backend)
        placement = gpus.current()  # a host's GPUs may differ: the one the call runs on
        device = placement.gpu.name if placement is not None else avail.device_name
        return {"kforge": __version__, **avail.versions, "device": device or ""}


def _facts_key(backend: str, placement: gpus.Placement | None) -> tuple[str, str]:
    """`ToolContext.device_facts`' key: the backend and its GPU (its uuid; "" for one GPU or none)."""
    return backend, gpus.gpu_id(placement.gpu) if placement is not None and placement.pinned else ""


def first_kinds_here() -> list[str]:
    """The backends whose fork servers a server starts beside its probe, guessed from what the host shows without
    torch (`Backend.host_device_nodes`): the GPU backends where their device nodes are here, and the CPU backends
    (a GPU job's compile step runs in a CPU worker: on a fresh 2x H200 server the cpu fork server's 3.0 s start was
    on the first verify's path, s25). The probe decides; `want_available` follows it."""
    classes = {name: backend_class(name) for name in backend_names()}
    gpu = [name for name, cls in classes.items() if cls.kind == "gpu" and cls.host_device_nodes()]
    return gpu + [name for name, cls in classes.items() if cls.kind != "gpu"]


# How long after the server's first probe only forks that jobs wait for start, where a job waited for that probe
# (`WorkerPool.defer_refills`): long enough for the job to ask for its workers; the refills follow.
_JOB_FIRST_AFTER_PROBE_S = 2.0


# How long a GPU host's CPU kinds wait for its GPU kinds' warm workers before they are readied anyway (a busy
# server may never have all of them idle). A job on a CPU backend asks for its kind at once (`WorkerPool.take`).
_OTHER_KINDS_AFTER_S = 60.0


def warm_kinds(avail: Availability) -> list[dict[str, str]]:
    """The extra environments of the warm workers a server keeps for an available backend: one per GPU of a
    multi-GPU host (pinned to it), else one (`kforge.tools.gpus`). Synchronous launches (`sync_launch_env`) get
    none: only a verify whose trial faulted runs again in such a worker (`evaluate.verify_against_reference`), and
    a second kind per GPU doubled the forks that the host's device-context starts limit."""
    kinds: list[dict[str, str]] = []
    for p in gpus.placements(avail) or [None]:
        if (env := gpus.pin_env(p)) not in kinds:
            kinds.append(env)
    return kinds
