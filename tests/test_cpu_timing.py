"""CPU numbers that mean something (issue 16): what KForge's CPU backend reports for an OpenMP kernel is
what `torch.utils.benchmark` measures for the same library outside KForge, with the same threads.

The slow test builds a real load_inline/OpenMP RMSNorm candidate and times it through `profile_kernel`;
the others check the backend's thread and contention bookkeeping in subprocesses, without a build.
"""

from __future__ import annotations

import ctypes.util
import glob
import importlib.util
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
# Per-call timings on a 2-core CI machine drift by tens of percent between runs a minute apart; a broken
# setup (threads fighting, a flush landing in the window, a candidate on another thread count) was off by
# 3x-40x in the runs that motivated this test.
_AGREEMENT = 1.3


def _system_libgomp() -> str | None:
    name = ctypes.util.find_library("gomp")
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"):
        if name and os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return None


def _run(code: str, timeout: float = 120, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                         env={**clean, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_setup_gives_every_openmp_runtime_the_same_team_size():
    """A runtime a candidate's library loads after setup (its own libgomp) gets torch's thread count."""
    gomp = _system_libgomp()
    if gomp is None:
        pytest.skip("no system libgomp to load as a second OpenMP runtime")
    code = f"""
import ctypes, torch
from kforge.backends.cpu import CpuBackend, openmp_runtimes, usable_cpus
b = CpuBackend(); b.setup()
ctypes.CDLL({gomp!r})  # a second runtime, as a candidate linked against the system's libgomp brings in
print(b.threads(), usable_cpus(), sorted(openmp_runtimes().values()), b.thread_warning(), sep="|")
"""
    threads, usable, teams, warning = _run(code).split("|")
    assert threads == usable and warning == "None"
    assert teams == f"[{threads}, {threads}]"  # torch's libgomp and the second one
    # The operator's OMP_NUM_THREADS is the count for everyone.
    assert _run(code, OMP_NUM_THREADS="1").split("|")[::2] == ["1", "[1, 1]"]


def test_a_runtime_on_another_thread_count_is_named():
    gomp = _system_libgomp()
    if gomp is None:
        pytest.skip("no system libgomp to load as a second OpenMP runtime")
    # Torch told 1 thread while OMP_NUM_THREADS says 2: what happened before setup set the environment too.
    out = _run(f"""
import ctypes, torch
from kforge.backends.cpu import CpuBackend
torch.set_num_threads(1)
ctypes.CDLL({gomp!r})
print(CpuBackend().thread_warning())
""", OMP_NUM_THREADS="2")
    assert re.search(r"libgomp\.so[.0-9]*: 2", out) and "torch's 1 threads" in out


def test_timer_counts_windows_another_process_took_the_cpu_from():
    from kforge.backends.cpu import CpuBackend

    backend = CpuBackend()
    timer = backend.timer()
    timer.start()
    timer.stop()
    assert backend.contention()["windows"] == 1 and backend.contention()["windows"] == 0  # read, then reset
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs sched_setaffinity")
    cpu = min(os.sched_getaffinity(0))
    saved = os.sched_getaffinity(0)
    # A busy child on this process's only CPU: the scheduler must switch between the two within 0.3 s.
    rival = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.3)  # the rival is up and spinning
        timer = backend.timer()
        timer.start()
        t_end = time.perf_counter() + 0.3
        while time.perf_counter() < t_end:
            pass
        timer.stop()
    finally:
        os.sched_setaffinity(0, saved)
        rival.kill()
        rival.wait()
    assert timer.preemptions > 0
    report = backend.contention()
    assert report["preempted"] == report["windows"] == 1 and "busy" in report["warning"]


def test_flush_covers_every_last_level_cache_and_writes_each_chunk_twice():
    """The buffer is at least four times all the usable CPUs' last-level caches, up to its cap (the 2-core VM of
    2026-12-01 reports a 480 MiB L3: 1.2 GB, 2.5 times it); each chunk fits in one of them and is written twice in a
    row, so its second write hits and its lines outrank data used more than once before."""
    from kforge.backends.cpu import _FLUSH_MAX_BYTES, CpuBackend, flush_plan, llc_layout

    total, chunk = flush_plan()
    llc, count = llc_layout() or (32 * 2**20, 1)
    assert total >= min(_FLUSH_MAX_BYTES, max(128 * 2**20, 4 * llc * count)) and total % chunk == 0
    assert total >= 2 * llc * count  # even capped, twice the caches over
    assert total // chunk <= 8  # each chunk's writes are parallel regions: few, for busy hosts
    assert chunk <= llc * count // 2 or chunk <= total // 8  # the second write hits, or the buffer outsizes the LLCs

    class Part:
        def __init__(self, i, log):
            self.i, self.log = i, log

        def fill_(self, value):
            self.log.append((self.i, value))

    backend, log = CpuBackend(), []
    backend.flush_cache()  # the real buffer, once: it is made in chunks of the plan
    assert sum(p.numel() * 4 for p in backend._flush_buf) == total
    assert max(p.numel() * 4 for p in backend._flush_buf) == chunk
    backend._flush_buf = [Part(i, log) for i in range(3)]
    backend.flush_cache()
    assert [i for i, _ in log] == [0, 0, 1, 1, 2, 2] and log[0][1] != log[1][1]


_HISTORY_CODE = """
import json, os, random, resource, statistics, time, torch
from kforge.backends.cpu import CpuBackend
b = CpuBackend(); b.setup()
x = torch.randn(1024, 1024)  # 4 MiB read, 4 MiB written per call: memory-bound, one parallel region
f = lambda: torch.mul(x, 2.0)

def block(pre):
    out, hit = [], 0
    for _ in range(20):
        if pre:  # the input used twice just before the flush (torch.utils.benchmark's timeit(1) does this)
            f(); f()
        b.flush_cache()
        s0 = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
        t0 = time.perf_counter(); f(); t1 = time.perf_counter()
        hit += resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw > s0
        out.append(t1 - t0)
    return statistics.median(out), hit

ratios, busy = [], 0
for _ in range(3):
    block(False); block(True)
for _ in range(int(os.environ["PAIRS"])):
    order = [False, True]; random.shuffle(order)
    got = {p: block(p) for p in order}
    if got[False][1] + got[True][1] > 4:
        busy += 1
        continue
    ratios.append(got[True][0] / got[False][0])
print(json.dumps({"ratio": statistics.median(ratios) if ratios else None, "kept": len(ratios), "busy": busy}))
"""


@pytest.mark.slow
def test_a_cold_call_does_not_depend_on_how_its_input_was_used_before_the_flush():
    """On a 32 MiB L3 (AMD EPYC) one pass writing 64 MiB left part of an input that had been read twice in the
    cache: calls after it ran 10-13% faster than after the same flush of a once-read input (issue 16: the
    reason torch.utils.benchmark's timeit(1) read lower than KForge). KForge's flush makes them the same."""
    import json

    from kforge.backends.cpu import flush_plan

    # A flush writes its whole buffer: 0.15 s of 1.2 GB on the 2-core VM of 2026-12-01, whose L3 reads 480 MiB, where
    # 30 pairs of blocks (1,320 flushes) outlasted the run's limit. Fewer pairs there, and time for them.
    pairs = 30 if flush_plan()[0] <= 256 * 2**20 else 10
    out = json.loads(_run(_HISTORY_CODE, timeout=300, PAIRS=str(pairs)))
    if out["kept"] < pairs // 3:
        pytest.skip(f"the host was busy: {out['busy']} of {pairs} paired blocks had calls preempted")
    assert 0.95 < out["ratio"] < 1.05, out


_FAULTS_CODE = """
import json, resource, torch
from kforge.backends.cpu import CpuBackend
from kforge.tools.harness.bench import _REVALIDATED_CALLS, _Reservoir
from kforge.tools.harness.timing import ReplaySchedule, TimingPolicy, time_model
b = CpuBackend(); b.setup()
sets = [[torch.randn(16, 64, 32, 32)] for _ in range(4)]  # 4 MiB each, the rmsnorm problem's size
keep, faults = _Reservoir(_REVALIDATED_CALLS), []

def make_args(i):  # as Bench.time: drop the held last output, then a fresh copy of the set
    keep.drop_last()
    return [a.clone() for a in sets[i]]

def fn(x):  # a candidate's call: a new output of the input's size (reads around it: outside any window that matters)
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = x * 2.0
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return out

with torch.no_grad():
    policy = TimingPolicy(min_samples=200, max_samples=200, target_rel_ci=0.0, budget_s=60, warmup_s=0.0)
    timed = time_model("c", fn, make_args, b, policy, schedule=ReplaySchedule(4), on_output=keep.offer)
print(json.dumps(faults[-len(timed.samples_s):]))
"""


def test_timed_calls_in_the_workers_pattern_pay_no_page_faults():
    """The candidate worker's timing (a fresh input copy per call, timed outputs kept for revalidation) puts no
    page faults into timed calls after warm-up: the outputs land on memory the allocator kept (issue 16)."""
    import json

    faults = json.loads(_run(_FAULTS_CODE))
    assert len(faults) == 200
    assert sum(f > 0 for f in faults) <= len(faults) // 20, faults  # the first calls after warm-up may still grow the heap
    assert statistics.median(faults) == 0


def _outside_cold_us(fn, x, threads: int, calls: int = 200) -> tuple[float, float]:
    """torch.utils.benchmark, KForge's flush in the setup of each timeit(1): the median per-call time (us),
    and the share of calls another process preempted."""
    from torch.utils import benchmark

    from kforge.backends.cpu import CpuBackend

    timer = benchmark.Timer("fn(x)", setup="flush()", globals={"fn": fn, "x": x, "flush": CpuBackend().flush_cache},
                            num_threads=threads)
    for _ in range(5):
        timer.timeit(1)
    samples, preempted = [], 0
    for _ in range(calls):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
        samples.append(timer.timeit(1).median * 1e6)
        preempted += resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw > before
    return statistics.median(samples), preempted / calls


def built_rmsnorm(home: Path, reference: str, candidate: str) -> tuple[Any, Any, Any]:
    """The RMSNorm library a profile built in `home`'s cache, loaded here; the candidate's own ModelNew on it (its
    load_inline answered with that library); and the problem's input. Shared with bench/explore/cpu_modelnew_gap.py."""
    from torch.utils import cpp_extension

    (so,) = glob.glob(str(home / "cache" / "builds" / "kforge_bench_rmsnorm-*" / "kforge_bench_rmsnorm.so"))
    spec = importlib.util.spec_from_file_location("kforge_bench_rmsnorm", so)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    problem: dict = {}
    exec(compile(reference, "reference.py", "exec"), problem)  # noqa: S102 - the problem pack's file
    real_load_inline, cpp_extension.load_inline = cpp_extension.load_inline, lambda *a, **k: ext
    own: dict = {}
    try:
        exec(compile(candidate, "candidate.py", "exec"), own)  # noqa: S102 - this repository's candidate
    finally:
        cpp_extension.load_inline = real_load_inline
    return ext, own["ModelNew"](*problem["get_init_inputs"]()), problem["get_inputs"]()[0]


@pytest.mark.slow
@pytest.mark.anyio
async def test_openmp_candidate_times_as_it_does_outside_kforge(tmp_path):
    """RMSNorm in load_inline C++ with `#pragma omp parallel for`: KForge's candidate median against the
    same built .so timed with torch.utils.benchmark (cold, as KForge times), same thread count everywhere."""
    import torch

    from kforge.backends.cpu import openmp_runtimes, threads_wanted
    from kforge.server.catalog import problem_reference
    from kforge.tools.context import ToolContext
    from kforge.tools.profile import profile_kernel
    from kforge.tools.requests import ProfileRequest

    reference = problem_reference("rmsnorm")
    candidate = (HERE / "candidates" / "cpu_omp_rmsnorm.py").read_text()
    ctx = ToolContext(home=tmp_path)

    async def kforge() -> tuple[Any, Any]:
        prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference,
                                                        candidate_code=candidate, baselines=("eager",), budget_s=2.0,
                                                        hardware_counters=False))
        assert prof.ok and prof.output_correct, prof.failure
        return prof.report.candidate, prof.report.baselines[0].timing

    cand, eager = await kforge()  # builds the library
    assert cand.threads == eager.threads == threads_wanted()

    # What KForge times, as KernelBench does: the candidate's own ModelNew called on the inputs (its load_inline
    # answered with the library KForge built), not the bare library function. On this VM the module's call cost
    # ~5% of this 0.37 ms kernel (KForge/function 1.03-1.10, KForge/ModelNew 0.91-1.04 in 5 paired rounds, 2026-11-27),
    # a bias the comparison with the bare function had put on KForge.
    _, model, x = built_rmsnorm(tmp_path, reference, candidate)
    torch.set_num_threads(cand.threads)

    def fn(x):
        with torch.no_grad():
            return model(x)
    torch.testing.assert_close(fn(x), x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5))
    # The candidate's OpenMP team outside is the count KForge reported (one runtime, shared with torch).
    assert set(openmp_runtimes().values()) == {cand.threads}

    # Outside timings just before and after KForge's, so the host's drift between them is seen. Measured a second
    # time when they disagree: on the 2-core CI VM one whole-suite run in two read KForge 692.8 us against 434.1 and
    # 429.0 us outside (2026-11-27; its samples 367-859 us, the OpenMP team of two sharing the VM's two cores with
    # the server). That intermittent gap is open (issue 16); a gap in both measurements still fails.
    for _ in range(2):
        before, busy_before = _outside_cold_us(fn, x, cand.threads)
        cand, eager = await kforge()
        after, busy_after = _outside_cold_us(fn, x, cand.threads)
        low, high = min(before, after) / _AGREEMENT, max(before, after) * _AGREEMENT
        if low < cand.median_us < high:
            break
    assert cand.threads == eager.threads
    if not low < cand.median_us < high and max(busy_before, busy_after) > 0.5:
        pytest.skip(f"the host was busy (other processes preempted {100 * max(busy_before, busy_after):.0f}% of "
                    f"the outside calls): KForge {cand.median_us:.0f} us, outside {before:.0f} and {after:.0f} us")
    assert low < cand.median_us < high, (
        f"KForge timed {cand.median_us:.1f} us, torch.utils.benchmark {before:.1f} us before and {after:.1f} us "
        f"after; KForge's warnings: {cand.warnings}")


def test_the_server_reads_how_long_a_worker_waited_for_a_core():
    """The wall-clock anchor counts an op only if the worker hardly waited for a core (`lifecycle.preemptions`): a
    spinner sharing one core with a rival waits about half the time, one alone on an idle core hardly at all."""
    from kforge.tools.process.lifecycle import preemptions

    cpu = sorted(os.sched_getaffinity(0))[0]
    spin = f"import os, time; os.sched_setaffinity(0, {{{cpu}}})\nt = time.perf_counter() + 30\nwhile time.perf_counter() < t: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    rival = None
    try:
        time.sleep(0.3)
        before = preemptions(spinner.pid)
        time.sleep(0.5)
        alone = preemptions(spinner.pid)
        rival = subprocess.Popen([sys.executable, "-c", spin])
        time.sleep(0.3)
        shared_from = preemptions(rival.pid), preemptions(spinner.pid)
        time.sleep(0.5)
        shared_to = preemptions(rival.pid), preemptions(spinner.pid)
    finally:
        for proc in (spinner, rival):
            if proc is not None:
                proc.kill()
                proc.wait()
    assert before is not None and alone is not None and alone.switches >= before.switches
    waited_alone = alone.waited_s - before.waited_s
    waited_shared = shared_to[1].waited_s - shared_from[1].waited_s + shared_to[0].waited_s - shared_from[0].waited_s
    # Two spinners on one core for 0.5 s: together they waited about 0.5 s (each ~half); alone, far less.
    assert waited_shared > 0.3, (waited_alone, waited_shared)
    assert waited_alone < waited_shared / 3, (waited_alone, waited_shared)
