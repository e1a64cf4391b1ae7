"""Input distributions for verification trials, and allocator poisoning (worker only).

Trials rotate over distributions derived from the reference's own `get_inputs()` so a kernel that
is right only on the reference's distribution is caught (ReLU as identity on [0, 1) inputs, TF32 or
bf16 hidden by large positive outputs): the native inputs, a zero-mean version, and versions scaled
down. A variant on which the reference's output is not finite is outside the problem's domain
and is replaced by the native distribution (the verdict says so).
"""

from __future__ import annotations

from typing import Any

__all__ = ["VARIANTS", "apply_variant", "poison_allocator", "to_float64"]

# (name, transform of one floating tensor); trial i uses VARIANTS[i % len(VARIANTS)].
VARIANTS: list[tuple[str, Any]] = [
    ("native", lambda x: x),
    ("zero_mean", lambda x: x - x.mean()),
    ("scaled_x1/8", lambda x: x * 0.125),
    ("zero_mean_scaled_x1/8", lambda x: (x - x.mean()) * 0.125),
]
# Scaled down, not up: element-wise tolerances are absolute, and a product of inputs scaled up by s
# grows by s^2, so rounding that is harmless at the native scale would fail an honest kernel.


def apply_variant(inputs: list[Any], variant: str) -> list[Any]:
    import torch

    fn = dict(VARIANTS)[variant]
    return [fn(x) if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1 else x for x in inputs]


def to_float64(value: Any) -> Any:
    """Floating tensors (and modules) in float64; everything else unchanged."""
    import torch

    if isinstance(value, torch.nn.Module):
        return value.double()
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    return value


def poison_allocator(sizes_bytes: list[int], device: str) -> None:
    """Fill memory the allocator will hand out next with NaN, then free it.

    PyTorch's caching allocator (and glibc's malloc for small blocks) returns a freed block to the
    next request of a similar size with its bytes untouched, so an output a kernel never wrote shows
    whatever was there: after this call, NaN rather than a previous, correct result.
    """
    import torch

    blocks = [torch.full((max(1, n // 4),), float("nan"), dtype=torch.float32, device=device) for n in sizes_bytes]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    del blocks
