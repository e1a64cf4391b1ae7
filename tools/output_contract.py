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
    """Bitwise-equal values (NaN equal to NaN), on CPU."""
    import torch

    if type(a) is not torch.Tensor or type(b) is not torch.Tensor:
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


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
