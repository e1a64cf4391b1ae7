"""`Bench.time` across the rounds of a series: only the first round pays the full warm-up."""

from types import SimpleNamespace

import torch

from kforge.backends.cpu import CpuBackend
from kforge.tools.harness import bench as bench_module
from kforge.tools.harness.bench import Bench
from kforge.tools.process.protocol import TimeRequest


def test_a_later_round_of_a_series_warms_up_on_one_call(monkeypatch):
    """The first round compiles, autotunes and grows the allocator in this process; the later ones of the same
    series need one call beside the estimate's three (3 calls of a 17 ms convolution were 51 ms a round)."""
    from kforge.tools.harness.timing import time_model

    seen: list[tuple[str, int]] = []

    def recording(label, fn, make_args, backend, policy, **kw):
        seen.append((label, policy.warmup_calls))
        return time_model(label, fn, make_args, backend, policy, **kw)

    monkeypatch.setattr(bench_module, "time_model", recording)
    backend = CpuBackend()
    session = SimpleNamespace(backend=backend, shelf=None, integrity=lambda: {}, failure=lambda exc, stage: repr(exc))
    bench = Bench(session, timing_sets=[[torch.ones(64)], [torch.ones(64)]])
    policy = {"warmup_calls": 3, "min_samples": 2, "max_samples": 4, "budget_s": 0.05}
    for label in ("eager", "candidate", "eager", "candidate", "eager"):
        reply = bench.time(TimeRequest(label=label, policy=policy), torch.nn.ReLU())
        assert reply.failure is None and reply.timing.samples >= 2
    assert seen == [("eager", 3), ("candidate", 3), ("eager", 1), ("candidate", 1), ("eager", 1)]
