"""When the judge runs the reference in float64 for exact outputs (`Judge._exact_too_large`): only where that
stays small, so a verify's device memory stays within about 3x the problem's footprint (issue 16)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kforge.tools.harness.judge import _EXACT_MAX_BYTES, Judge


def _judge(input_bytes: int, output_bytes: int) -> SimpleNamespace:
    return SimpleNamespace(expected=[torch.empty(output_bytes // 4, device="meta")], input_bytes=input_bytes,
                           backend=SimpleNamespace(device="cpu", memory_capacity=lambda: 80 * 2**30))  # an 80 GB GPU


def test_a_small_problem_gets_its_float64_outputs():
    assert Judge._exact_too_large(_judge(64 * 2**20, 64 * 2**20)) is None  # 0.5 GiB in float64


def test_a_mid_size_problem_skips_them_and_says_why():
    # 1.6 GB of float32 inputs and outputs, 6.3 GB in float64: far below 1/8 of an 80 GB GPU, over the cap.
    why = Judge._exact_too_large(_judge(1_200_000_000, 400_000_000))
    assert why is not None and "about 3x the problem's footprint" in why and "its own precision" in why
    edge = _EXACT_MAX_BYTES // 4  # inputs + outputs of this many bytes: the cap, counted twice over in float64
    assert Judge._exact_too_large(_judge(edge // 2, edge // 2)) is None
    assert Judge._exact_too_large(_judge(edge // 2 + 4096, edge // 2)) is not None
