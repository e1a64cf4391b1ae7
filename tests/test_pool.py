"""The warm-worker pool around a timing: no fork readies a device beside it, and a job's workers end in the
background without leaving anything for the next job to share the device with."""

from __future__ import annotations

import math
import re

import os
from pathlib import Path

import anyio
import pytest

from kforge.backends import backend_class
from kforge.tools.context import ToolContext
from kforge.tools.process.runner import WorkerGroup
from kforge.tools.process.lifecycle import kill_group

pytestmark = pytest.mark.anyio

SYNC_LAUNCHES = backend_class("cuda").sync_launch_env  # a worker kind of synchronous launches


def _idle(pool, *kind) -> int:
    return len(pool._idle[("cpu", tuple(sorted(dict(kind).items())))])


async def _ready(pool, n: int) -> None:
    """Wait until n warm cpu workers are idle, over its kinds (one of its own on a CPU, whose calls are synchronous
    already; `_two_cpu_kinds` asks for a second)."""
    with anyio.fail_after(180):
        while sum(len(v) for (b, _), v in pool._idle.items() if b == "cpu") < n:
            await anyio.sleep(0.1)


async def _settled(pool, n: int) -> None:
    """Wait until n plain cpu workers are idle and no fork is under way (a hold's test then starts from rest)."""
    with anyio.fail_after(240):
        while _idle(pool) < n or pool._under_way:
            await anyio.sleep(0.1)


def _two_cpu_kinds(pool) -> None:
    """A second cpu kind, as a pool of two GPUs keeps a kind pinned to each: for the tests of how the pool treats kinds
    apart (a cpu pool keeps one kind)."""
    pool.want("cpu", SYNC_LAUNCHES)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


async def test_held_forks_start_after_the_release_but_a_waiting_job_still_gets_one(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        await _ready(pool, 1)
        release = ctx.hold_forks()
        taken = pool.take("cpu")
        assert taken is not None
        await anyio.sleep(1.0)  # a refill would have started by now
        assert _idle(pool) == 0 and not pool._starting[("cpu", ())], "a fork started while held"
        # A job that finds none idle waits for a fork even while held: it cannot go on without one.
        with anyio.fail_after(120):
            waited = await pool.acquire("cpu")
        assert waited is not None
        with anyio.fail_after(120):
            while sum(pool._starting.values()):  # every kind's
                await anyio.sleep(0.05)
        release()
        release()  # idempotent
        with anyio.fail_after(120):
            while _idle(pool) < 1:
                await anyio.sleep(0.1)
        assert pool._quiet == 0
        for warm in (taken, waited):
            await kill_group(warm.proc)
            await warm.proc.aclose()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def _stopped(pid: int) -> bool:
    """Whether the process is (or becomes, within a second: a signal is delivered asynchronously) stopped."""
    with anyio.move_on_after(1):
        while _state(pid) != "T":
            await anyio.sleep(0.01)
    return _state(pid) == "T"


async def _under_way_with_pid(pool) -> list:
    with anyio.fail_after(60):
        while not (forks := [f for f in pool._under_way if f.pid is not None and f.scope is not None]):
            await anyio.sleep(0.01)
    return forks


async def test_a_timing_stops_the_forks_under_way_and_they_go_on_after_it(tmp_path):
    """The forks a job's takes started are stopped, not waited for, while a profile times; they keep their work."""
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        forks = await _under_way_with_pid(pool)  # the server's first refills, still readying
        deadline = forks[0].scope.deadline
        release = ctx.hold_forks()
        ctx.pause_forks()
        for fork in forks:
            assert await _stopped(fork.pid), "a fork under way kept running beside the timing"
        await anyio.sleep(1.5)
        assert all(_state(f.pid) == "T" for f in forks)
        assert forks[0].scope.deadline == math.inf  # the wait for its answer does not run while it is stopped
        started = pool.started
        release()
        assert forks[0].scope.deadline >= deadline + 1.5  # the pause does not count
        with anyio.fail_after(120):
            await _ready(pool, 1)
        assert pool.started >= started + len(forks) and not pool.problems


async def test_a_job_waiting_for_a_worker_lets_a_stopped_fork_of_its_kind_go_on(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        _two_cpu_kinds(pool)
        forks = await _under_way_with_pid(pool)
        release = ctx.hold_forks()
        ctx.pause_forks()
        backend, env = forks[0].kind
        with anyio.fail_after(150):  # on a busy 2-core CI machine a fork took over the default 30 s
            warm = await pool.acquire(backend, dict(env), wait_s=120)
        assert warm is not None, (pool.problems, pool._wanted, {k: len(v) for k, v in pool._idle.items()},
                                  dict(pool._starting), [(f.kind, f.pid, f._stopped_at, f.pid and _state(f.pid))
                                                         for f in pool._under_way])
        others = [f for f in pool._under_way if f.kind != forks[0].kind and f.pid is not None]
        assert all([await _stopped(f.pid) for f in others])  # only its own kind
        release()
        await kill_group(warm.proc)
        await warm.proc.aclose()


async def test_quiet_waits_for_the_forks_a_job_waits_for_but_not_for_stopped_ones(tmp_path):
    """A warm-up's rounds start only when no fork readies a device beside them: one the next verify waited for (and
    so went on through the pause) ran beside a warm-up's eager, which read 12.2% slow (level2/80, H200, s36)."""
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        forks = await _under_way_with_pid(pool)
        release = ctx.hold_forks()
        ctx.pause_forks()
        with anyio.fail_after(30):  # only stopped forks under way: nothing to wait for
            await pool.quiet(timeout_s=60)
        assert all([await _stopped(f.pid) for f in forks])
        backend, env = forks[0].kind
        got = []

        async def job() -> None:
            got.append(await pool.acquire(backend, dict(env), wait_s=120))

        async with anyio.create_task_group() as tg:
            tg.start_soon(job)
            with anyio.fail_after(10):
                while not any(not f.stopping for f in pool._under_way):  # the job's wait lets its kind go on
                    await anyio.sleep(0.01)
            with anyio.fail_after(150):
                await pool.quiet(timeout_s=150)
            assert not any(not f.stopping for f in pool._under_way), [(f.pid, f.stopping) for f in pool._under_way]
        assert got and got[0] is not None, pool.problems
        release()
        await kill_group(got[0].proc)
        await got[0].proc.aclose()


async def test_a_jobs_workers_are_killed_at_once_and_collected_in_the_background(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        _two_cpu_kinds(pool)
        await _ready(pool, 2)
        scratch = ctx.home / "jobs" / "job"  # where warm workers can write (their sandbox predates the job)
        async with WorkerGroup(pool) as group:
            judge = await group.start(ctx.worker("cpu", scratch / "judge", "judge"))
            candidate = await group.start(ctx.worker("cpu", scratch / "candidate", "candidate",
                                                     extra_env=SYNC_LAUNCHES))
            pids = [judge._proc.pid, candidate._proc.pid]
            assert judge.warm and candidate.warm
        # Killed before the group's exit returned; their exits are awaited by the pool.
        with anyio.fail_after(10):
            while not all(_gone(p) for p in pids):
                await anyio.sleep(0.02)
        with anyio.fail_after(10):
            while pool._reaping:
                await anyio.sleep(0.02)
        assert judge._proc is None and candidate._proc is None  # closed: streams and process handles let go
        with anyio.fail_after(120):
            nxt = await pool.acquire("cpu")
        assert nxt is not None and nxt.proc.pid not in pids
        await kill_group(nxt.proc)
        await nxt.proc.aclose()


async def test_without_a_pool_a_group_waits_for_its_workers(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    async with WorkerGroup(ctx.pool) as group:
        worker = await group.start(ctx.worker("cpu", tmp_path / "w", "candidate"))
        pid = worker._proc.pid
        assert not worker.warm
    assert worker._proc is None and _gone(pid)
    assert os.path.isdir(tmp_path / "w")


async def test_the_next_job_waits_for_killed_workers_only_when_they_held_much_device_memory(tmp_path):
    """A job of several GB must find the last job's memory free; after a small one, nothing is waited for."""
    from kforge.tools.process.pool import _REAP_BEFORE_NEXT_BYTES

    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(0) as pool:
        for held, waits in ((_REAP_BEFORE_NEXT_BYTES + 1, True), (2**20, False)):
            closed = anyio.Event()

            async def close() -> None:
                await anyio.sleep(0.5)
                closed.set()
            assert pool.reap([close], held)
            await pool.reaped()
            assert closed.is_set() is waits
            with anyio.fail_after(5):
                await closed.wait()


async def test_a_candidate_that_dies_in_the_profilers_window_is_reported_as_exited(tmp_path, cpu_example, candidate):
    """The charts are drawn beside the profile's last steps: a worker's death there is still the candidate's."""
    from kforge.tools.profile import profile_kernel
    from kforge.tools.requests import ProfileRequest

    ctx = ToolContext(home=tmp_path / "home")
    result = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=cpu_example["reference"],
                                                      candidate_code=candidate("exits_when_profiled"),
                                                      baselines=("eager",), budget_s=0.3, hardware_counters=False))
    assert not result.ok and result.failure is not None, str(result)
    assert result.failure.kind == "exited" and "code 3" in result.failure.message, result.failure


async def test_a_warm_workers_directory_is_its_roles_scratch_and_goes_with_the_job(tmp_path, cpu_example):
    """A warm worker's sandbox predates its job: it writes only the directory the pool made for it, which the
    job links as its role's scratch; the job's end removes both, the pool's end the idle workers' own."""
    from kforge.tools.evaluate import verify_against_reference
    from kforge.tools.requests import VerifyRequest

    ctx = ToolContext(home=tmp_path / "home")
    jobs = ctx.home / "jobs"
    async with ctx.warm_workers(1) as pool:
        await _ready(pool, 1)
        idle = {w.scratch for kind in list(pool._idle.values()) for w in kind}
        assert idle and all(d.parent == jobs and d.name.startswith("w-") and d.is_dir() for d in idle)
        result = await verify_against_reference(ctx, VerifyRequest(backend="cpu",
                                                                   reference_code=cpu_example["reference"],
                                                                   candidate_code=cpu_example["candidate"], trials=1,
                                                                   use_store=False))
        assert result.correct, str(result)
        with anyio.fail_after(60):  # its judge and its candidate are kept for the next job of their code, with their directories
            while not (pool.kept["judge"] and pool.kept["candidate"]):
                await anyio.sleep(0.05)
        kept = {w.scratch for parked in pool._kept.values() for _, w in parked}
        left = [p for p in jobs.iterdir() if any(p.iterdir()) and p not in kept]
        assert len(kept) == 2 and not left, f"a job's files stayed behind: {[(p, list(p.iterdir())) for p in left]}"
    assert not list(jobs.iterdir())


async def test_a_light_hold_refills_only_kinds_short_of_idle_workers(tmp_path):
    """A verify's hold (light) starts no fork of a kind that still has two idle workers (a profile's takes), but
    one of a kind short of them: the profile after the verify must not wait for its workers."""
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(3) as pool:
        await _settled(pool, 3)
        release = ctx.hold_forks(light=True)
        taken = [pool.take("cpu")]
        await anyio.sleep(1.0)  # a refill would have started by now
        assert _idle(pool) == 2 and not pool._starting[("cpu", ())], "a fork started while two were idle"
        taken.append(pool.take("cpu"))
        with anyio.fail_after(5):
            while not pool._starting[("cpu", ())]:
                await anyio.sleep(0.02)
        release()
        for warm in taken:
            assert warm is not None
            await kill_group(warm.proc)
            await warm.proc.aclose()


async def test_beside_a_verify_only_taken_kinds_refill_and_only_what_a_profile_takes(tmp_path):
    """A verify's hold lets a kind it took from refill up to a profile's two workers, and a kind no job has taken not
    at all: a fresh server's first cpu verify ran beside 7 forks and a fork server on 2 cores (s26). The rest follows
    the hold's release."""
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(3) as pool:
        await _settled(pool, 3)
        release = ctx.hold_forks(light=True)
        untaken = ("cpu", (("KFORGE_POOL_TEST_KIND", "1"),))
        pool.want("cpu", dict(untaken[1]))  # wanted, but no job has taken a worker of it
        taken = [pool.take("cpu") for _ in range(3)]
        most = 0
        for _ in range(40):  # 2 s: every refill the hold allows has started
            most = max(most, pool._starting[("cpu", ())] + _idle(pool))
            assert not pool._starting[untaken] and not pool._idle[untaken], "a kind no job took refilled beside a verify"
            await anyio.sleep(0.05)
        assert most == 2, f"{most} workers of the verify's kind beside it, where a profile takes 2"
        release()
        with anyio.fail_after(240):  # then both fill up
            while _idle(pool) < 3 or not pool._idle[untaken]:
                await anyio.sleep(0.1)
        for warm in taken:
            assert warm is not None
            await kill_group(warm.proc)
            await warm.proc.aclose()


async def test_a_verify_starts_no_fork_beside_its_trials_and_its_refills_follow_it(tmp_path, cpu_example):
    """A verify holds the pool's forks (lightly): with enough idle workers the refills its takes ask for start
    once it is done, so nothing readies a device (or takes a core) beside its trials; then the pool fills up."""
    from kforge.tools.evaluate import verify_against_reference
    from kforge.tools.requests import VerifyRequest

    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(4) as pool:  # one cpu kind: its two takes leave two idle, so it is not short
        await _ready(pool, 4)
        with anyio.fail_after(120):
            while pool._under_way:  # every first fork done
                await anyio.sleep(0.05)
        seen: list[int] = []
        done = anyio.Event()

        async def watch() -> None:
            while not done.is_set():
                seen.append(len(pool._under_way))
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            result = await verify_against_reference(ctx, VerifyRequest(
                backend="cpu", reference_code=cpu_example["reference"], candidate_code=cpu_example["candidate"],
                trials=2, use_store=False))
            done.set()
        assert result.correct, str(result)
        assert len(seen) > 5 and max(seen) == 0, f"forks under way beside the verify: {seen}"
        assert pool._quiet == 0
        with anyio.fail_after(120):  # the refills came after it
            await _ready(pool, 4)


async def test_a_take_that_leaves_a_kind_short_keeps_more_of_it(tmp_path):
    """Jobs back to back take a kind faster than one refill at a time: a take that leaves fewer than two idle
    raises the kind's target, as a miss does, so the next run of jobs finds its workers ready."""
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(2) as pool:
        await _settled(pool, 2)
        kind = ("cpu", ())
        assert pool._target[kind] == 2
        taken = pool.take("cpu")  # one left: short of a profile's two
        assert taken is not None and pool._target[kind] == 3
        with anyio.fail_after(240):
            while _idle(pool) < 3:
                await anyio.sleep(0.1)
        await kill_group(taken.proc)
        await taken.proc.aclose()


async def test_a_hold_on_one_gpu_holds_the_refills_of_every_gpu(tmp_path):
    """On a host of several GPUs a job's hold covers the refills of every GPU's workers, not only its own: the driver
    starts device contexts one at a time host-wide, and the other GPU's allocations wait behind them (its verifies'
    trials ran 7x slower beside the refills of the other GPU, 2x H200, s20). The kinds here are cpu workers labelled
    with a GPU pin: this tests the pool's bookkeeping, not a GPU."""
    from kforge.tools import gpus

    from .test_gpu_placement import fake_cuda

    ctx = ToolContext(home=tmp_path / "home")
    gpu_a, gpu_b = gpus.placements(fake_cuda(2))
    on_a, on_b = gpus.pin_env(gpu_a), gpus.pin_env(gpu_b)
    async with ctx.warm_workers(1) as pool:
        for env in (on_a, on_b):
            pool.want("cpu", env)
        with anyio.fail_after(240):
            while _idle(pool, *on_a.items()) < 1 or _idle(pool, *on_b.items()) < 1 or pool._under_way:
                await anyio.sleep(0.1)
        with gpus.placed_on(gpu_a):
            release = ctx.hold_forks()  # a job's on GPU a
        taken = [pool.take("cpu", on_a), pool.take("cpu", on_b)]
        kinds = [("cpu", tuple(on.items())) for on in (on_a, on_b)]
        await anyio.sleep(1.0)
        assert not any(pool._starting[k] for k in kinds) and _idle(pool, *on_a.items()) == _idle(pool, *on_b.items()) == 0
        release()
        with anyio.fail_after(120):  # both refill once it is released
            while _idle(pool, *on_a.items()) < 1 or _idle(pool, *on_b.items()) < 1:
                await anyio.sleep(0.1)
        for warm in taken:
            assert warm is not None
            await kill_group(warm.proc)
            await warm.proc.aclose()


async def test_a_fork_kept_stopped_past_its_deadline_does_not_time_out(tmp_path):
    """A fork's wait for its answer stops with the fork: one kept stopped through a timing longer than the wait (a
    torch.compile baseline, a whole profile) used to read as a fork that could not start its device, and the pool
    gave its kind up for the server's life (seen in CI: both cpu kinds' forks, kept stopped by a test's hold)."""
    import subprocess
    import sys

    from kforge.tools.process.pool import _Fork

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        fork = _Fork(("cpu", ()))
        fork.forked(sleeper.pid)
        with anyio.move_on_after(0.5) as scope:  # the wait, much shorter than the stop below
            fork.timed_by(scope)
            fork.stop()
            assert await _stopped(sleeper.pid) and scope.deadline == math.inf
            await anyio.sleep(1.0)  # past the wait's first deadline, still stopped
            fork.go_on()
            assert anyio.current_time() < scope.deadline <= anyio.current_time() + 0.5  # what was left of it
            with anyio.fail_after(1):  # SIGCONT reaches it
                while _state(sleeper.pid) == "T":
                    await anyio.sleep(0.01)
            await anyio.sleep(5)
        assert scope.cancel_called  # the wait's clock ran again once the fork went on
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_a_fork_that_gives_no_answer_is_killed_and_its_kind_tried_again_before_the_pool_gives_it_up(
        tmp_path, monkeypatch):
    """A fork past its deadline (a busy machine's, or one stuck) is killed and reported with what its processes were
    doing; the kind is given up only after `_FORK_TRIES` such forks in a row."""
    from kforge.tools.process import pool as pool_module

    # No fork readies its device this fast (at 0.2 s a cpu fork on a warm machine sometimes did, and this part failed
    # in a full run: 2026-11-28); a second fork started at once meets it too, the third gets the 60 s set below.
    monkeypatch.setattr(pool_module, "_FORK_TIMEOUT_S", 0.05)
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        kind = ("cpu", ())
        with anyio.fail_after(180):
            while not pool._failed[kind] and not pool._idle[kind]:
                await anyio.sleep(0.01)
        cpu_given_up = lambda: [p for p in pool.problems if p.startswith("cpu")]  # noqa: E731 (another backend's
        # kind, triton's where it runs on CPUs, may give up meanwhile: its forks meet the same short deadline)
        assert pool._failed[kind] == 1 and kind in pool._wanted and not cpu_given_up()  # tried again, not given up
        monkeypatch.setattr(pool_module, "_FORK_TIMEOUT_S", 60.0)
        with anyio.fail_after(180):
            await _ready(pool, 1)
        assert pool._failed[kind] == 0 and not cpu_given_up()
    ctx = ToolContext(home=tmp_path / "home2")
    # Shorter than any fork's start (its sandbox alone takes ~0.04 s): once the zygote's pages are warm, a cpu fork
    # here readied within 0.2 s often enough that three in a row never failed (1 run in ~14, 2026-11-27).
    monkeypatch.setattr(pool_module, "_FORK_TIMEOUT_S", 0.05)
    async with ctx.warm_workers(1) as pool:
        with anyio.fail_after(180):
            while not any(p.startswith("cpu") for p in pool.problems):
                # A fork that readied within the deadline after all: end it, so that the pool forks again, until 3
                # in a row give no answer.
                if (ready := pool._pop_idle(kind)) is not None:
                    await ready.discard()
                await anyio.sleep(0.05)
        assert pool._failed[kind] == pool_module._FORK_TRIES and kind not in pool._wanted
        problem = next(p for p in pool.problems if p.startswith("cpu"))
        assert "no answer in 0 s of running" in problem, problem
        if "not forked yet" in problem:  # the deadline came before the zygote named the fork: it ends on EOF
            return
        assert "python" in problem, problem
        forked = [int(p) for p in re.findall(r"(\d+) python", problem)]
        with anyio.move_on_after(10):  # (a signal is delivered asynchronously)
            while not all(_gone(p) for p in forked):
                await anyio.sleep(0.05)
        assert forked and all(_gone(p) for p in forked), problem  # killed, not left readying


def _tree(pid: int) -> set[int]:
    """The pid and its descendants (a sandboxed worker runs as the child of the pid the server knows)."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            todo += [int(c) for c in task.read_text().split()]
    return found


def _blocked_signals(pid: int) -> set[int]:
    """The signals blocked in process `pid` (its main thread's mask, from /proc)."""
    mask = int(re.search(r"SigBlk:\s*([0-9a-f]+)", Path(f"/proc/{pid}/status").read_text()).group(1), 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads signal masks in /proc")
async def test_workers_start_with_no_signal_blocked_whatever_their_parent_blocked(tmp_path):
    """A Ray actor blocks SIGINT, and a mask is inherited by every process below: `perf stat`, stopped by SIGINT,
    then never stopped (each profile on a Ray node waited 10 s and lost its counters). A worker clears its mask,
    cold or warm, so what it starts sees signals as on a plain host."""
    import signal

    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        ctx = ToolContext(home=tmp_path / "home")
        async with ctx.warm_workers(1) as pool:
            pool.want("cpu")
            with anyio.fail_after(240):
                while _idle(pool) < 1:
                    await anyio.sleep(0.1)
            with ctx.scratch("signals") as scratch:
                async with WorkerGroup(ctx.pool) as group:
                    warm = await group.start(ctx.worker("cpu", scratch / "warm", "candidate"))
                    cold = await group.start(ctx.worker("cpu", scratch / "cold", "candidate", extra_env={"X_COLD": "1"}))
                    for worker in (warm, cold):
                        pids = _tree(worker._proc.pid)
                        python = [p for p in pids if "kforge.tools.harness.worker" in
                                  Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
                        assert python, pids
                        assert all(signal.SIGINT not in _blocked_signals(p) for p in python), \
                            {p: _blocked_signals(p) for p in python}
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


async def test_a_limit_on_forks_at_once_holds_every_kind_to_it_and_forks_the_kind_a_job_waits_for_first(tmp_path):
    """`max_forks`: the pool never has more forks under way than the limit, over all its kinds; when it has room for
    one, a kind some job waits for gets it before a kind that only refills."""
    ctx = ToolContext(home=tmp_path / "home", max_forks=1)
    async with ctx.warm_workers(2) as pool:
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, sum(pool._starting.values()))
                await anyio.sleep(0.005)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await _ready(pool, 2)  # the cpu kind's two, one at a time
            _two_cpu_kinds(pool)  # a second kind wants its two; a job of the first kind then waits for one
            await anyio.sleep(0)  # (its refill is asked for first)
            taken = [pool.take("cpu"), pool.take("cpu")]
            with anyio.fail_after(180):
                waited = await pool.acquire("cpu")
            idle_of_second_kind = _idle(pool, *SYNC_LAUNCHES.items())
            tg.cancel_scope.cancel()
    assert most == 1
    assert waited is not None and idle_of_second_kind <= 1, "the waiting job's kind got the fork after the other's two"
    for warm in (*taken, waited):
        await kill_group(warm.proc)
        await warm.proc.aclose()


async def test_the_trace_says_where_a_fork_servers_start_and_each_forks_readying_go(tmp_path):
    """Where a server's first worker of a kind waits (seconds on a GPU host: the fork server's imports, then each
    worker's device), by phase: the fork server's preload and each forked worker's own account, in the trace."""
    import json

    from kforge.tools.process.limits import WorkerLimits

    trace = tmp_path / "trace.jsonl"
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(trace_file=str(trace)))
    async with ctx.warm_workers(1) as pool:
        await _ready(pool, 1)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    [zygote] = [line for line in lines if line["op"] == "zygote cpu"]
    assert set(zygote["phases"]) == {"backend module", "dynamo, extensions, profiler", "harness",
                                     "compilers' identities", "compilers' identities: C++ toolchain id"}, zygote
    top = {name: s for name, s in zygote["phases"].items() if ": " not in name}  # a part is inside its phase
    assert sum(top.values()) <= zygote["s"]  # the rest: the interpreter's start and torch's import
    assert zygote["phases"]["compilers' identities: C++ toolchain id"] <= zygote["phases"]["compilers' identities"]
    forks = [line for line in lines if line["op"] == "fork cpu"]
    assert forks and all(set(f["phases"]) == {"sandbox", "setup", "device", "libraries"} for f in forks), forks
    assert all(sum(f["phases"].values()) <= f["s"] for f in forks)


async def test_the_devices_ceilings_are_measured_in_a_warm_worker(tmp_path):
    """A new data directory's first profile measures the device's ceilings: in a worker of its own from the pool, not
    a cold one (whose start is seconds on a GPU host)."""
    import json

    from kforge.tools.process.limits import WorkerLimits

    trace = tmp_path / "trace.jsonl"
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(trace_file=str(trace)))
    async with ctx.warm_workers(1) as pool:
        await _ready(pool, 1)
        facts = await ctx.device_facts("cpu")
    assert facts.peak_bandwidth_gbs and facts.peak_bandwidth_gbs > 0, facts
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    starts = [line for line in lines if line["role"] == "ceilings" and line["op"] == "start"]
    assert starts and all(line["warm"] for line in starts), starts


async def test_a_gpu_hosts_cpu_kinds_are_warmed_once_its_gpu_kinds_are_idle(tmp_path, monkeypatch):
    """The GPU kinds first; a CPU kind's fork server and forks would take the host's cores while they start."""
    from kforge.backends import Availability
    from kforge.tools.process.pool import WorkerPool

    wanted: list[str] = []
    idle = anyio.Event()
    monkeypatch.setattr(WorkerPool, "want", lambda self, backend, env=None: wanted.append(backend))
    monkeypatch.setattr(WorkerPool, "settled", lambda self: idle.is_set())
    ctx = ToolContext(home=tmp_path / "home")
    ctx._availability = [Availability(backend="cpu", ok=True, reason="", kind="cpu"),
                         Availability(backend="gpu-like", ok=True, reason="", kind="gpu")]
    async with ctx.warm_workers(1):
        with anyio.fail_after(10):
            while not wanted:
                await anyio.sleep(0.05)
        await anyio.sleep(0.5)
        assert wanted == ["gpu-like"]
        idle.set()
        with anyio.fail_after(10):
            while len(wanted) < 2:
                await anyio.sleep(0.05)
    assert wanted == ["gpu-like", "cpu"]


async def test_a_fresh_servers_fork_servers_start_beside_its_probe_and_one_it_does_not_confirm_is_ended(
        tmp_path, monkeypatch):
    """The fork servers the host's devices point to start before the probe has answered (their imports are a fresh
    server's first worker's longest wait); one for a backend the probe finds unavailable is closed."""
    import json

    from kforge.tools import context
    from kforge.tools.process.limits import WorkerLimits

    monkeypatch.setattr(context, "first_kinds_here", lambda: ["cpu", "cuda"])  # as if this host showed a GPU
    trace = tmp_path / "trace.jsonl"
    ctx = ToolContext(home=tmp_path / "home", limits=WorkerLimits(trace_file=str(trace)))
    async with ctx.warm_workers(1) as pool:
        await _ready(pool, 1)
        assert not any(a.ok for a in await ctx.availability() if a.backend == "cuda")  # a CPU host
        assert "cuda" not in pool._zygotes and "cpu" in pool._zygotes
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    [probe] = [line for line in lines if line["role"] == "probe" and line["op"] == "probe"]
    [zygote] = [line for line in lines if line["op"] == "zygote cpu"]
    assert zygote["at"] < probe["at"] + probe["s"], (zygote, probe)


async def test_while_a_job_waits_for_a_fork_no_refill_of_another_kind_starts_and_it_starts_after(tmp_path):
    """Forks ready their devices one at a time on a GPU host: a refill started beside the fork a job waits for delays
    that fork. So while a job waits, only the forks jobs wait for start; the other kinds' refills follow."""
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(2) as pool:
        await _ready(pool, 2)
        taken = [pool.take("cpu"), pool.take("cpu")]  # its refills start; the job below waits for one of them
        second = ("cpu", tuple(sorted(SYNC_LAUNCHES.items())))
        most, got = 0, []

        async def job() -> None:
            got.append(await pool.acquire("cpu"))

        with anyio.fail_after(180):
            async with anyio.create_task_group() as tg:
                tg.start_soon(job)
                while not pool._waiting[("cpu", ())]:
                    await anyio.sleep(0.001)
                _two_cpu_kinds(pool)  # wanted now, while the job waits
                while not got:
                    most = max(most, pool._starting[second] + len(pool._idle[second]))
                    await anyio.sleep(0.005)
        assert got[0] is not None
        assert most == 0, "another kind's refill started while a job waited for its fork"
        with anyio.fail_after(180):  # ... and it starts once the job has its worker
            while _idle(pool, *SYNC_LAUNCHES.items()) < 2:
                await anyio.sleep(0.1)
        for warm in (*taken, *got):
            await kill_group(warm.proc)
            await warm.proc.aclose()


async def test_a_call_that_waited_for_the_first_probe_gets_its_forks_before_the_refills(tmp_path):
    """A fresh server's first call waits for the probe; then every kind the probe confirmed is wanted at once. Its
    refills wait a moment (`defer_refills`) so that the call's own forks, asked for right after, start alone."""
    import time

    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        with anyio.fail_after(180):
            await ctx.require_backend("cpu")  # a job's, beside the pool's own (`want_available`)
        assert pool._refills_after > time.monotonic(), "no refill was deferred for the call that waited"
        await anyio.sleep(0.3)
        assert not sum(pool._starting.values()) and not _idle(pool), "a refill started before the call asked"
        with anyio.fail_after(180):
            got = await pool.acquire("cpu")  # the call's own fork starts at once, deferral or not
        assert got is not None
        with anyio.fail_after(180):  # ... and the refills follow the deferral
            while _idle(pool) < 1:
                await anyio.sleep(0.1)
        await kill_group(got.proc)
        await got.proc.aclose()


async def test_a_listing_that_waited_for_the_first_probe_defers_no_refill(tmp_path):
    """list_backends or doctor on a fresh server asks for no worker: the refills start when the probe ends, so the
    first job after them finds warm workers (deferring them for a listing left a server idle for 2 s, s26)."""
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        with anyio.fail_after(180):
            await ctx.availability()  # a listing's, beside the pool's own
        assert pool._refills_after == 0.0, "a listing deferred the refills"
        with anyio.fail_after(180):
            while _idle(pool) < 1:
                await anyio.sleep(0.05)


def test_a_gpu_hosts_fork_servers_beside_the_probe_are_its_gpu_backends_and_the_cpu_ones(monkeypatch):
    """A GPU job's compile step runs in a CPU worker, so the CPU backends' fork server starts beside the probe too."""
    from kforge.backends import backend_class, backend_names
    from kforge.tools import context

    gpu = [n for n in backend_names() if backend_class(n).kind == "gpu"]
    cpu = [n for n in backend_names() if backend_class(n).kind != "gpu"]
    for name in gpu:
        monkeypatch.setattr(backend_class(name), "host_device_nodes", classmethod(lambda cls: ["/dev/nvidia0"]))
    assert context.first_kinds_here() == gpu + cpu and "cpu" in cpu
    for name in gpu:
        monkeypatch.setattr(backend_class(name), "host_device_nodes", classmethod(lambda cls: []))
    assert context.first_kinds_here() == cpu
