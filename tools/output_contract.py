"""Per-call checks of the output contract, run in the candidate's worker next to the call.

Outputs must not alias an input (a kernel that returns its input, or writes into it, passes
identity-like problems) and inputs must come back unmodified (a kernel that zeroes its inputs fools a
harness that computes the reference afterwards, and later calls get cheaper). Both are checked on
the device tensors the candidate actually received, against the judge's pristine copies.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["aliased_outputs", "modified_inputs", "same_values"]


def same_values(a: Any, b: Any) -> bool:
    """Bitwise-equal values (NaN equal to NaN), compared where `a` lives, a chunk at a time."""
    import torch

    if type(a) is not torch.Tensor or type(b) is not torch.Tensor:
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().reshape(-1), b.detach().reshape(-1)
    for lo in range(0, a.numel(), _CHUNK):
        x, y = a[lo:lo + _CHUNK], b[lo:lo + _CHUNK].to(a.device)
        same = (x == y) | (torch.isnan(x) & torch.isnan(y)) if x.is_floating_point() or x.is_complex() else x == y
        if not bool(same.all()):
            return False
    return True


_CHUNK = 1 << 26  # elements per comparison: temporaries stay small however large the tensors


def modified_inputs(args: Sequence[Any], pristine: Sequence[Any]) -> list[int]:
    """Positions of tensor inputs whose values changed during the call."""
    import torch

    return [i for i, (a, p) in enumerate(zip(args, pristine))
            if isinstance(a, torch.Tensor) and not same_values(a, p)]


def _span(t: Any) -> tuple[int, int] | None:
    storage = t.untyped_storage()
    return (storage.data_ptr(), storage.data_ptr() + storage.nbytes()) if storage.nbytes() else None


def aliased_outputs(outputs: Sequence[Any], args: Sequence[Any]) -> list[str]:
    """'output j shares memory with input i' for every overlap of storages."""
    import torch

    found = []
    for j, out in enumerate(outputs):
        if type(out) is not torch.Tensor or (o := _span(out)) is None:
            continue
        for i, arg in enumerate(args):
            if isinstance(arg, torch.Tensor) and (a := _span(arg)) is not None and o[0] < a[1] and a[0] < o[1]:
                found.append(f"output {j} shares memory with input {i}")
    return found
