"""Input distributions for verification trials, and allocator poisoning (worker only).

Trials rotate over distributions derived from the reference's own `get_inputs()` so a kernel that
is right only on the reference's distribution is caught (ReLU as identity on [0, 1) inputs, TF32 or
bf16 hidden by large positive outputs): the native inputs, a zero-mean version, and versions scaled
down. A variant on which the reference's output is not finite is outside the problem's domain
and is replaced by the native distribution (the verdict says so).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["VARIANTS", "SeededSets", "apply_variant", "build_model", "probe_preserving_", "poison_allocator",
           "seeded_inputs", "to_float64"]

# (name, in-place transform of one floating tensor); trial i uses VARIANTS[i % len(VARIANTS)]. In place: a
# several-GB input must not be held twice (or three times) while its variant is made.
VARIANTS: list[tuple[str, Any]] = [
    ("native", lambda x: x),
    ("zero_mean", lambda x: x.sub_(x.mean())),
    ("scaled_x1/8", lambda x: x.mul_(0.125)),
    ("zero_mean_scaled_x1/8", lambda x: x.sub_(x.mean()).mul_(0.125)),
]
# Scaled down, not up: element-wise tolerances are absolute, and a product of inputs scaled up by s
# grows by s^2, so rounding that is harmless at the native scale would fail an honest kernel.


def build_model(make: Any, seed: int, backend: Any) -> Any:
    """`make()` with its initial weights drawn from `seed` on the backend's device, then moved there.

    On a device with its own memory (`backend.kind == "gpu"`) the weights are made there: a KernelBench GEMM layer
    of 8192x8192 takes about half a second to initialise on the CPU, milliseconds on the device. The judge and the candidate's process build the same
    way from the same seed, so their weights agree bit for bit. A constructor that cannot run with a device
    default (a CPU-only call) is built on the CPU instead, from the same seed, in both processes alike.
    """
    torch.manual_seed(seed)
    if backend.kind == "gpu":
        try:
            with torch.device(backend.device):
                return backend.to_device(make())
        except Exception:  # noqa: BLE001 - the CPU build below raises what is really wrong, if anything
            torch.manual_seed(seed)
    return backend.to_device(make())


def apply_variant(inputs: list[Any], variant: str) -> list[Any]:
    """`inputs` (made for this call, owned by the caller) in the distribution `variant`, changed in place; an
    input whose memory another input shares (`[x, x]`, views) is changed on a copy, so it changes once."""
    fn = dict(VARIANTS)[variant]
    if variant == "native":
        return inputs
    spans = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) if isinstance(t, torch.Tensor) else None
             for t in inputs]

    def shared(i: int) -> bool:
        return spans[i] is not None and any(j != i and s is not None and s[0] < spans[i][0] + spans[i][1]
                                            and spans[i][0] < s[0] + s[1] for j, s in enumerate(spans))

    return [fn(x if not shared(i) else x.clone()) if isinstance(x, torch.Tensor) and x.is_floating_point()
            and x.numel() > 1 else x for i, x in enumerate(inputs)]


def to_float64(value: Any) -> Any:
    """Floating tensors (and modules) in float64; everything else unchanged."""
    if isinstance(value, torch.nn.Module):
        return value.double()
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    return value


def poison_allocator(sizes_bytes: list[int], backend: Any) -> None:
    """Fill memory the allocator will hand out next with NaN, then free it (on the backend's device, waiting for
    the fills to finish there before the blocks go back).

    PyTorch's caching allocator (and glibc's malloc for small blocks) returns a freed block to the
    next request of a similar size with its bytes untouched, so an output a kernel never wrote shows
    whatever was there: after this call, NaN rather than a previous, correct result.
    """
    blocks = [torch.full((max(1, n // 4),), float("nan"), dtype=torch.float32, device=backend.device)
              for n in sizes_bytes]
    backend.synchronize()
    del blocks


def seeded_inputs(module: Any, seed: int, backend: Any) -> list[Any]:
    """`module.get_inputs()` under `seed`, made on the backend's device.

    Every process that needs a problem's inputs makes them itself from the server's secret seed, so no
    input travels through a file and none waits in host memory: factory calls without a device
    (`torch.rand(n)`) run on the device under `torch.device(...)`, whose generator the seed also sets.
    The same seed gives bit-identical inputs in the judge and in the candidate's process.
    """
    import random

    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass
    with torch.device(backend.device):
        made = list(module.get_inputs())
    return backend.to_device(made)


class SeededSets:
    """A problem's trial inputs as (seed, distribution) pairs, made on the device when asked for.

    The judge and the candidate's process each hold one, built from the same seeds and the distributions
    the judge settled on, so no input travels between them and only the set in use occupies memory (the
    last one made is kept, since a trial asks for its set several times in a row).
    """

    def __init__(self, module: Any, seeds: list[int], variants: list[str], backend: Any) -> None:
        self.module, self.seeds, self.variants, self.backend = module, list(seeds), list(variants), backend
        self._last: tuple[tuple[int, str], list[Any]] | None = None

    def __len__(self) -> int:
        return len(self.seeds)

    def __getitem__(self, i: int) -> list[Any]:
        if not 0 <= i < len(self.seeds):
            raise IndexError(i)
        if self._last is None or self._last[0] != (i, self.variants[i]):
            self._last = None  # free the previous set before making the next
            self._last = ((i, self.variants[i]), self.fresh(i))
        return self._last[1]

    def fresh(self, i: int) -> list[Any]:
        """Set i made anew, not kept: a candidate's call gets tensors no earlier call has touched."""
        return apply_variant(seeded_inputs(self.module, self.seeds[i], self.backend), self.variants[i])

    def drop(self) -> None:
        """Free the set kept for reuse."""
        self._last = None


def probe_preserving_(inputs: list[Any], shift: int) -> list[Any]:
    """Change inputs in place so a cheap probe cannot tell them from before: same tensors (shape, dtype,
    address), same first and last elements, same values in another order (so the same sum), but the
    interior rotated by a secret `shift`. A candidate that memoizes answers keyed on such a probe returns
    the old answer, and the comparison catches it; an honest candidate computes the new one."""
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_contiguous() and x.numel() > 3:
            inner = x.view(-1)[1:-1]
            inner.copy_(torch.roll(inner, shift % inner.numel() or 1))
    return inputs
