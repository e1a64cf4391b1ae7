"""Models are built with their weights made on the GPU, alike in the judge and the candidate's process
(skipped without a GPU; run by scripts/run_gpu_tests.sh)."""

from __future__ import annotations

import pytest

from kforge.backends import load_backend
from kforge.tools.harness.inputs import build_model

pytestmark = pytest.mark.gpu


def test_weights_are_made_on_the_device_the_same_way_twice() -> None:
    import torch

    backend = load_backend("cuda")
    make = lambda: torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.LayerNorm(1024))  # noqa: E731
    first, second = build_model(make, 1234, backend), build_model(make, 1234, backend)
    other = build_model(make, 1235, backend)
    for (name, a), b, c in zip(first.state_dict().items(), second.state_dict().values(), other.state_dict().values()):
        assert a.device.type == "cuda", name
        assert torch.equal(a, b), name  # what the judge and the candidate's process each build agrees bit for bit
    assert not torch.equal(first[0].weight, other[0].weight)  # and the seed decides it


def test_a_constructor_that_needs_the_cpu_is_built_there_then_moved() -> None:
    import torch

    class CpuOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            table = torch.randn(64)
            self.register_buffer("table", torch.from_numpy(table.numpy().copy()))  # .numpy() fails on a GPU tensor

    backend = load_backend("cuda")
    a, b = build_model(CpuOnly, 7, backend), build_model(CpuOnly, 7, backend)
    torch.manual_seed(7)
    assert a.table.device.type == "cuda" and torch.equal(a.table, b.table)
    assert torch.equal(a.table.cpu(), torch.randn(64))  # the CPU draw of seed 7, as before device builds
