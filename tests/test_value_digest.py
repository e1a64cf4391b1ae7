"""The digest that stands in for an output too large to keep beside its repeat (`output_contract.value_digest`):
it agrees with `same_values`, NaN payloads and complex NaNs included, for every dtype."""

from __future__ import annotations

import pytest
import torch

from kforge.tools.harness.output_contract import digest_weights, same_values, value_digest

W = digest_weights("cpu")


def _nan_with_payload(dtype: torch.dtype, n: int) -> torch.Tensor:
    """NaNs whose bits differ from torch's own NaN (a different mantissa payload)."""
    words = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64}[dtype]
    x = torch.full((n,), float("nan"), dtype=dtype)
    return (x.view(words) | 1).view(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_every_nan_digests_alike_and_a_changed_value_does_not(dtype):
    a = torch.randn(1000).to(dtype)
    a[::7] = float("nan")
    b = a.clone()
    b[::7] = _nan_with_payload(dtype, len(b[::7]))
    assert not torch.equal(a.view(torch.uint8), b.view(torch.uint8))  # the bits differ ...
    assert same_values(a, b) and value_digest(a, W) == value_digest(b, W)  # ... the values do not
    c = a.clone()
    c[3] = c[3] + 1
    assert not same_values(a, c) and value_digest(a, W) != value_digest(c, W)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_values_digest_by_both_parts_and_any_nan_part_alike(dtype):
    a = torch.randn(3000, dtype=dtype)
    b = a.clone()
    a[5] = complex(float("nan"), 1.0)
    b[5] = complex(2.0, float("nan"))  # NaN in the other part: equal in same_values
    assert same_values(a, b) and value_digest(a, W) == value_digest(b, W)
    c = b.clone()
    c[10] = complex(c[10].real.item(), c[10].imag.item() + 1)  # only the imaginary part changed
    assert not same_values(b, c) and value_digest(b, W) != value_digest(c, W)


def test_integer_and_bool_outputs_and_shape_and_dtype_count():
    i = torch.arange(100, dtype=torch.int64)
    assert value_digest(i, W) == value_digest(i.clone(), W)
    assert value_digest(i, W) != value_digest(i.flip(0), W)
    assert value_digest(i, W) != value_digest(i.view(10, 10), W)
    assert value_digest(i, W) != value_digest(i.to(torch.int32), W)
    flags = torch.rand(100) > 0.5
    assert value_digest(flags, W) == value_digest(flags.clone(), W) != value_digest(~flags, W)
