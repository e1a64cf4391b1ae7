"""Where KForge's CPU timing of the OpenMP RMSNorm candidate stands against the same kernel timed outside
(issue 16, must-hold 5), round by round, and what else ran on the host meanwhile.

Each round: torch.utils.benchmark (cold: KForge's flush before each call, KForge's thread count) on the bare
library function KForge built, then `profile_kernel` (eager baseline, no hardware counters), then the bare
function again and the candidate's own ModelNew (its `load_inline` answered with that library), which is what
KForge and KernelBench time. With `--watch`, a thread samples every process's CPU time during the profile (it
costs the host ~6% of a core, which KForge then pays: leave it off for the ratios). `--no-sandbox`: workers
without the sandbox.

Usage: python bench/explore/cpu_modelnew_gap.py [--rounds 5] [--watch] [--no-sandbox] > out.txt
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))


def cpu_ticks() -> dict[int, tuple[int, str]]:
    out = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = open(f"/proc/{p}/stat").read()
                fields = stat[stat.rindex(")") + 2:].split()
                out[int(p)] = (int(fields[11]) + int(fields[12]), open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:100])
            except OSError:
                pass
    return out


class Watch(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.first: dict[int, tuple[int, str]] = {}
        self.last: dict[int, tuple[int, str]] = {}
        self.done = False

    def run(self) -> None:
        while not self.done:
            for pid, seen in cpu_ticks().items():
                self.first.setdefault(pid, seen)
                self.last[pid] = seen
            time.sleep(0.05)

    def top(self, n: int = 5) -> list[str]:
        tck = os.sysconf("SC_CLK_TCK")
        rows = sorted(((self.last[p][0] - self.first[p][0]) / tck, p, self.last[p][1]) for p in self.last)[::-1][:n]
        return [f"{cpu:6.2f} s  {pid} {cmd}" for cpu, pid, cmd in rows]


async def main(args: argparse.Namespace) -> None:
    import torch

    import test_cpu_timing as T
    from kforge.server.catalog import problem_reference
    from kforge.tools.context import ToolContext
    from kforge.tools.process.limits import WorkerLimits
    from kforge.tools.profile import profile_kernel
    from kforge.tools.requests import ProfileRequest

    home = Path(tempfile.mkdtemp())
    ctx = ToolContext(home=home, limits=WorkerLimits(sandbox=not args.no_sandbox))
    reference = problem_reference("rmsnorm")
    source = (ROOT / "tests" / "candidates" / "cpu_omp_rmsnorm.py").read_text()

    async def kforge():
        prof = await profile_kernel(ctx, ProfileRequest(backend="cpu", reference_code=reference, candidate_code=source,
                                                        baselines=("eager",), budget_s=2.0, hardware_counters=False))
        assert prof.ok, prof.failure
        return prof.report.candidate

    cand = await kforge()  # builds the library
    ext, model, x = T.built_rmsnorm(home, reference, source)
    torch.set_num_threads(cand.threads)

    def function(x):
        return ext.rmsnorm_fwd(x, 1e-5)

    def modelnew(x):
        with torch.no_grad():
            return model(x)

    print(f"# {time.strftime('%Y-%m-%d %H:%M')} threads {cand.threads} torch {torch.__version__} "
          f"sandbox {not args.no_sandbox} watch {args.watch} input {tuple(x.shape)}")
    print("round | KForge us | function before/after us | ModelNew us | KForge/function | KForge/ModelNew")
    for r in range(args.rounds):
        before, _ = T._outside_cold_us(function, x, cand.threads)
        watch = Watch()
        if args.watch:
            watch.start()
        cand = await kforge()
        watch.done = True
        after, _ = T._outside_cold_us(function, x, cand.threads)
        mod, _ = T._outside_cold_us(modelnew, x, cand.threads)
        fn_mean = (before + after) / 2
        print(f"{r} | {cand.median_us:.0f} | {before:.0f}/{after:.0f} | {mod:.0f} | {cand.median_us / fn_mean:.3f} | "
              f"{cand.median_us / mod:.3f}", flush=True)
        if args.watch:
            print("\n".join("    " + row for row in watch.top()))


if __name__ == "__main__":  # the chart processes are spawned: they re-import this file
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--watch", action="store_true")
    parser.add_argument("--no-sandbox", action="store_true")
    asyncio.run(main(parser.parse_args()))
