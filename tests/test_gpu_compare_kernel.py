"""The fused compare on a GPU (`harness/compare_kernel.py`): the checks the torch passes give, on the cases of
`test_compare_kernel.py`, and on an output of two of its launches (over 2^28 elements) with a float64 truth."""

from __future__ import annotations

import pytest
import torch

from .test_compare import CASE_VERDICTS
from .test_compare_kernel import _differences, same_checks

pytestmark = pytest.mark.gpu


def test_the_fused_compare_gives_what_the_torch_passes_give_on_a_gpu():
    result = same_checks("cuda", "gpu")
    assert result["differences"] == []
    assert result["launches"] >= 4 * 11
    assert result["verdicts"] == CASE_VERDICTS


@pytest.mark.parametrize("wrong_at", [None, 300_000_000])
def test_an_output_of_two_launches(wrong_at):
    import kforge.tools.harness.compare as compare

    torch.manual_seed(0)
    e = torch.randn(300_000_007, device="cuda")  # 2^28 + 31.6 M: a second launch of another length
    g = e + 1e-6
    if wrong_at is not None:
        g[wrong_at] += 1.0  # in the second launch
    truth = e.double()
    checks = {}
    for mode in ("gpu", "off"):
        compare._FUSED = mode
        try:
            checks[mode] = compare.compare_outputs([e], [g], exact=[truth], device="cuda")[0]
        finally:
            compare._FUSED = "gpu"
    assert _differences(checks["gpu"].model_dump(), checks["off"].model_dump()) == []
    assert checks["gpu"].correct == (wrong_at is None)
    if wrong_at is not None:
        assert checks["gpu"].mismatches == 1 and checks["gpu"].first_mismatches[0].index == [wrong_at]
