"""A timing series over rounds, read on the server: one series' statistics from its rounds' replies, and the
replay check that the worker's timing loop (`kforge.tools.harness.timing`) also applies to each round.

Server side and pure (no torch): `kforge.tools.profile` merges the rounds a worker timed.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from kforge.profilers.report import TimingStats

__all__ = ["merge_rounds", "replay_warning"]

_REPLAY_RATIO = 1.5
_REPLAY_NEIGHBOURS = 3  # repeated calls on either side a fresh call is compared with


def replay_warning(samples: list[float], fresh: list[bool], disturbed: Sequence[bool] = ()) -> str | None:
    """Calls on inputs seen before must not be much faster than calls on new ones *next to them*.

    Each fresh call is compared with the repeated calls nearest to it in time, and the verdict is
    the median of those ratios: fresh sets run out partway through sampling, so a global median
    would blame replay for any drift (a noisy neighbour, an allocator still growing) between the
    start and the end of the run. A replaying candidate is faster on every repeat, wherever it is. Calls that
    another process interrupted (`disturbed`, host backends) are left out: on a busy 2-core host a few fresh
    calls that landed in a burst of other work read as replay.
    """
    quiet = [not d for d in disturbed] if len(disturbed) == len(samples) else [True] * len(samples)
    ratios, fresh_times, repeat_times = [], [], []
    for i, is_fresh in enumerate(fresh):
        if not is_fresh or not quiet[i]:
            continue
        near = [samples[j] for j in range(max(0, i - _REPLAY_NEIGHBOURS), min(len(samples), i + _REPLAY_NEIGHBOURS + 1))
                if not fresh[j] and quiet[j]]
        if near:
            ratios.append(samples[i] / max(statistics.median(near), 1e-12))
            fresh_times.append(samples[i])
            repeat_times.extend(near)
    if len(ratios) < 3 or statistics.median(ratios) < _REPLAY_RATIO:
        return None
    return (f"calls on inputs seen before took {statistics.median(repeat_times) * 1e6:.1f} us, calls on new inputs "
            f"next to them {statistics.median(fresh_times) * 1e6:.1f} us (median ratio x{statistics.median(ratios):.1f}): "
            "answers replayed from earlier calls?")


def merge_rounds(label: str, replies: Sequence[dict[str, Any]]) -> tuple[TimingStats, list[list[float]]]:
    """One series' statistics over all its rounds, and its samples (seconds) round by round.

    Replay is judged over the whole series (the fresh sets are spent across rounds), from each sample's
    fresh/repeat flag; the rounds' other findings carry over.
    """
    rounds = [[x / 1e6 for x in r["samples_us"]] for r in replies]
    every = [s for r in rounds for s in r]
    fresh = [f for r in replies for f in r.get("fresh", [])]
    disturbed = [d for r in replies for d in r.get("disturbed") or [False] * len(r["samples_us"])]
    parts = [TimingStats(**r["timing"]) for r in replies]
    replay = replay_warning(every, fresh, disturbed) if len(fresh) == len(every) and any(fresh) else None
    drop = ("seen before", "only ", "noisy:")  # recomputed over the whole series below
    warnings = list(dict.fromkeys(w for p in parts for w in p.warnings if not any(d in w for d in drop)))
    hosts = [p.host_median_us for p in parts if p.host_median_us is not None]
    clocks = [p.sm_clock_mhz for p in parts if p.sm_clock_mhz]
    launches = [p.launch_us for p in parts if len(p.launch_us) == 3]
    stats = TimingStats.from_samples_s(
        label, every, extra_warnings=warnings + ([replay] if replay else []),
        host_median_us=statistics.median(hosts) if hosts else None, unseen_work=any(p.unseen_work for p in parts),
        replay_suspected=bool(replay), input_sets=parts[0].input_sets, threads=parts[0].threads,
        clock="host" if any(p.clock == "host" for p in parts) else "device", rounds=len(parts),
        sm_clock_mhz=(min(c[0] for c in clocks), max(c[1] for c in clocks)) if clocks else (),
        clock_slowdowns=tuple(dict.fromkeys(r for p in parts for r in p.clock_slowdowns)),
        # the rounds' lowest and highest, and the median of their medians (a round's reads are not kept)
        launch_us=(min(x[0] for x in launches), round(statistics.median(x[1] for x in launches), 2),
                   max(x[2] for x in launches)) if launches else ())
    return stats, rounds
