"""The current host-paced rule (`profilers/report.py::widen_for_host_pace`) applied to a sweep's saved profiles: what
each self-comparison of `bench/kernelbench_sample.py --sweep` would read now, from the numbers that run measured
(medians, launch costs, device time), without a GPU. For a change of the rule's thresholds, measured on a past run.
The saved intervals are those the run reported, already widened by the rule of its day: a rule that narrows one (the
device-time bound of the side that idles) shows only where it is narrower than that. A `--candidate graphed` sweep
also gives the speedup do_bench read in its own process, and whether the interval holds it.

    python bench/explore/rejudge_host_pace.py bench/results/kernelbench-sweep-h200-2026-12-02-s33.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kforge.profilers.report import Baseline, ProfileReport, TimingStats, widen_for_host_pace


def stats(d: dict) -> TimingStats:
    return TimingStats(**{k: v for k, v in d.items() if k in TimingStats.model_fields})


def rejudge(row: dict) -> str:
    p = row.get("profile") or {}
    e = p.get("eager") or {}
    if not (p.get("candidate") and e.get("timing") and e.get("speedup_ci")):
        return f"| {row['problem']} | not profiled against eager | | | | |"
    cand = stats(p["candidate"])
    eager = Baseline(name="eager", timing=stats(e["timing"]), speedup=e["speedup"], speedup_ci=tuple(e["speedup_ci"]),
                     comparison=e["comparison"], launches_per_call=e.get("launches_per_call"),
                     host_launches_per_call=e.get("host_launches_per_call"), device_us_per_call=e.get("device_us_per_call"))
    now = widen_for_host_pace(ProfileReport(
        backend="cuda", device_name="-", collector="torch.profiler", candidate=cand, baselines=(eager,),
        launches_per_call=p.get("launches_per_call"), host_launches_per_call=p.get("host_launches_per_call"),
        device_us_per_call=p.get("device_us_per_call")))
    busy = f"{p['device_us_per_call'] / cand.median_us:.2f}" if p.get("device_us_per_call") else "-"
    lo, hi = now.baselines[0].speedup_ci
    seen = (row.get("local") or {}).get("do_bench_speedup")
    held = f"{seen:.3f} ({'inside' if lo <= seen <= hi else 'OUTSIDE'})" if seen else "-"
    return (f"| {row['problem']} | {busy} | {e['speedup']:.3f} [{e['speedup_ci'][0]:.3f}, {e['speedup_ci'][1]:.3f}] "
            f"{e['comparison']} | [{lo:.3f}, {hi:.3f}] {now.baselines[0].comparison} | {now.host_pace_resolution or '-'} "
            f"| {held} |")


def main() -> None:
    res = json.loads(Path(sys.argv[1]).read_text())
    print("| problem | device busy | as run: speedup vs eager (CI) | under the current rule | resolution "
          "| do_bench's speedup |")
    print("|---|---|---|---|---|---|")
    for row in res["rows"]:
        print(rejudge(row))


if __name__ == "__main__":
    main()
