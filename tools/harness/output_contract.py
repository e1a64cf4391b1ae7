"""Per-call checks of the output contract, run in the candidate's worker next to the call.

Outputs must not alias an input (a kernel that returns its input, or writes into it, passes
identity-like problems) and inputs must come back unmodified (a kernel that zeroes its inputs fools a
harness that computes the reference afterwards, and later calls get cheaper). Both are checked on
the device tensors the candidate actually received, against the judge's pristine copies.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["aliased_outputs", "digest_weights", "modified_inputs", "same_values", "value_digest"]


def same_values(a: Any, b: Any) -> bool:
    """Bitwise-equal values (NaN equal to NaN), compared where `a` lives, a chunk at a time."""
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
_DIGEST_CHUNK = 1 << 22  # words per digest step (a few tens of MB of temporaries)
_WORDS = {1: "uint8", 2: "int16", 4: "int32"}  # element bytes -> the integer word read; larger ones: int64


def digest_weights(device: str) -> Any:
    """Secret weights for `value_digest`, drawn from the OS (not the seeded generators: the candidate's process
    makes the same inputs from the same seeds)."""
    import os

    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(os.urandom(8), "little"))
    return torch.randint(1, 2**31, (_DIGEST_CHUNK,), dtype=torch.int64, device=device, generator=gen)


def value_digest(value: Any, weights: Any) -> Any:
    """A digest of a value's bits (every NaN alike, as in `same_values`), for "bitwise the same as an earlier
    output" where that output could not be kept beside the new one: secret-weighted sums of its words."""
    if type(value) is not torch.Tensor:
        return ("value", repr(value))
    flat = value.detach().reshape(-1)
    # A complex element is two words (its real and imaginary parts); one with a NaN part equals any other such
    # element in `same_values`, so all of them digest as NaN+NaNj.
    parts = 2 if flat.is_complex() else 1
    words = getattr(torch, _WORDS.get(flat.element_size() // parts, "int64"))
    total = 0
    for lo in range(0, flat.numel(), _DIGEST_CHUNK // parts):
        chunk = flat[lo:lo + _DIGEST_CHUNK // parts]
        if chunk.is_floating_point() or chunk.is_complex():
            nan = complex(float("nan"), float("nan")) if parts == 2 else float("nan")
            chunk = torch.where(torch.isnan(chunk), torch.full((), nan, dtype=chunk.dtype, device=chunk.device), chunk)
        if parts == 2:
            chunk = torch.view_as_real(chunk).reshape(-1)
        w = chunk.view(words).to(torch.int64)
        step = int((w * weights[: w.numel()].to(w.device)).sum())  # wraps in int64, the same way every time
        total = (total * 1_000_003 + step) & (2**64 - 1)
    return str(value.dtype), tuple(value.shape), total


def modified_inputs(args: Sequence[Any], pristine: Sequence[Any]) -> list[int]:
    """Positions of tensor inputs whose values changed during the call."""
    return [i for i, (a, p) in enumerate(zip(args, pristine))
            if isinstance(a, torch.Tensor) and not same_values(a, p)]


def _span(t: Any) -> tuple[int, int] | None:
    storage = t.untyped_storage()
    return (storage.data_ptr(), storage.data_ptr() + storage.nbytes()) if storage.nbytes() else None


def aliased_outputs(outputs: Sequence[Any], args: Sequence[Any]) -> list[str]:
    """'output j shares memory with input i' for every overlap of storages."""
    found = []
    for j, out in enumerate(outputs):
        if type(out) is not torch.Tensor or (o := _span(out)) is None:
            continue
        for i, arg in enumerate(args):
            if isinstance(arg, torch.Tensor) and (a := _span(arg)) is not None and o[0] < a[1] and a[0] < o[1]:
                found.append(f"output {j} shares memory with input {i}")
    return found
