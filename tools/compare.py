"""Compare a candidate's outputs with the reference's, element by element, with stated tolerances.

Runs in the judge worker, which holds the expected outputs; the candidate never sees them.
"""

from __future__ import annotations

from typing import Any

from .models import Mismatch, OutputCheck, TensorInfo, Tolerance

__all__ = ["compare_outputs", "flatten_outputs", "tensor_info", "tolerance_for"]

_FIRST_MISMATCHES = 5

# dtype -> (atol, rtol, why). fp32 follows KernelBench's current default with the reference
# computed with TF32 off; half types follow KernelBench/TritonBench; integers must match exactly.
_TOLERANCES = {
    "torch.float64": (1e-7, 1e-7, "float64: atol=rtol=1e-7; summation order alone moves results by about 1e-13"),
    "torch.float32": (1e-4, 1e-4, "float32: atol=rtol=1e-4 (KernelBench's fp32 default); allows reordered sums, not reduced precision"),
    "torch.float16": (1e-2, 1e-2, "float16: atol=rtol=1e-2 (KernelBench's half-precision default)"),
    "torch.bfloat16": (1e-2, 1e-2, "bfloat16: atol=rtol=1e-2 (KernelBench's half-precision default)"),
}
_EXACT_WHY = "integer/bool: must match exactly"


def tolerance_for(dtype: Any, *, atol: float | None = None, rtol: float | None = None) -> Tolerance:
    name = str(dtype)
    base_atol, base_rtol, why = _TOLERANCES.get(name, (0.0, 0.0, _EXACT_WHY))
    if "float8" in name:
        base_atol, base_rtol, why = 1e-1, 1e-1, "float8: atol=rtol=1e-1"
    if atol is not None or rtol is not None:
        base_atol = base_atol if atol is None else atol
        base_rtol = base_rtol if rtol is None else rtol
        why = f"set by the caller (atol={base_atol:g}, rtol={base_rtol:g}); default would be: {why}"
    return Tolerance(dtype=name.removeprefix("torch."), atol=base_atol, rtol=base_rtol, why=why)


def flatten_outputs(out: Any) -> list[Any]:
    """A model's output as a flat list (a single tensor becomes a one-element list)."""
    if isinstance(out, (list, tuple)):
        flat: list[Any] = []
        for item in out:
            flat.extend(flatten_outputs(item))
        return flat
    return [out]


def tensor_info(value: Any) -> TensorInfo:
    import torch

    if type(value) is torch.Tensor:
        return TensorInfo(kind="tensor", shape=list(value.shape), dtype=str(value.dtype).removeprefix("torch."),
                          device=str(value.device))
    return TensorInfo(kind=type(value).__name__)


def _compare_one(index: int, expected: Any, got: Any, atol: float | None, rtol: float | None) -> OutputCheck:
    import torch

    exp_info = tensor_info(expected)
    if type(expected) is not torch.Tensor:
        ok = got == expected
        return OutputCheck(output=index, correct=bool(ok), expected=exp_info, got=tensor_info(got),
                           problems=[] if ok else [f"expected {expected!r}, got {got!r}"])
    if got is None:
        return OutputCheck(output=index, correct=False, expected=exp_info, got=None, problems=["missing output"])
    got_info = tensor_info(got)
    problems = []
    if type(got) is not torch.Tensor:
        problems.append(f"output is a {type(got).__name__}, not a torch.Tensor")
        return OutputCheck(output=index, correct=False, expected=exp_info, got=got_info, problems=problems)
    if got.shape != expected.shape:
        problems.append(f"shape {list(got.shape)} != expected {list(expected.shape)}")
    if got.dtype != expected.dtype:
        problems.append(f"dtype {got_info.dtype} != expected {exp_info.dtype}")
    tol = tolerance_for(expected.dtype, atol=atol, rtol=rtol)
    if problems:
        return OutputCheck(output=index, correct=False, expected=exp_info, got=got_info, problems=problems, tolerance=tol)

    e = expected.detach().to("cpu", torch.float64)
    g = got.detach().to("cpu", torch.float64)
    both_nan = torch.isnan(e) & torch.isnan(g)
    diff = (g - e).abs()
    # Same-signed infinities compare equal; inf - inf is NaN, so handle them before the tolerance test.
    same_inf = torch.isinf(e) & (g == e)
    within = (diff <= tol.atol + tol.rtol * e.abs()) | both_nan | same_inf
    bad = ~within
    mismatches = int(bad.sum())
    finite = torch.isfinite(e) & torch.isfinite(g)
    max_abs = float(diff[finite].max()) if bool(finite.any()) else 0.0
    big = finite & (e.abs() > max(tol.atol, 1e-12))
    max_rel = float((diff[big] / e.abs()[big]).max()) if bool(big.any()) else 0.0
    nan_count = int((torch.isnan(g) & ~torch.isnan(e)).sum())
    inf_count = int((torch.isinf(g) & ~torch.isinf(e)).sum())
    first = []
    if mismatches:
        for flat_idx in torch.nonzero(bad.flatten()).flatten()[:_FIRST_MISMATCHES].tolist():
            idx = list(torch.unravel_index(torch.tensor(flat_idx), e.shape)) if e.dim() else []
            first.append(Mismatch(index=[int(i) for i in idx], got=float(g.flatten()[flat_idx]),
                                  expected=float(e.flatten()[flat_idx])))
        problems.append(f"{mismatches} of {e.numel()} elements differ beyond atol={tol.atol:g}, rtol={tol.rtol:g} "
                        f"(max abs error {max_abs:.3g})")
    if nan_count:
        problems.append(f"{nan_count} NaN where the reference is not NaN")
    if inf_count:
        problems.append(f"{inf_count} Inf where the reference is finite")
    return OutputCheck(output=index, correct=mismatches == 0, expected=exp_info, got=got_info, problems=problems,
                       max_abs_error=max_abs, max_rel_error=max_rel, mismatches=mismatches, numel=e.numel(),
                       first_mismatches=first, nan_count=nan_count, inf_count=inf_count, tolerance=tol)


def _with_devices(check: OutputCheck, expected_device: str | None, got_device: str | None) -> OutputCheck:
    """Put back the devices the tensors lived on (the judge compares CPU copies) and check them."""
    update: dict[str, Any] = {}
    if expected_device:
        update["expected"] = check.expected.model_copy(update={"device": expected_device})
    if got_device and check.got is not None:
        update["got"] = check.got.model_copy(update={"device": got_device})
    if expected_device and got_device and expected_device.split(":")[0] != got_device.split(":")[0]:
        update["correct"] = False
        update["problems"] = check.problems + [f"device {got_device} != expected {expected_device}"]
    return check.model_copy(update=update) if update else check


def compare_outputs(expected: list[Any], got: list[Any], *, atol: float | None = None, rtol: float | None = None,
                    expected_devices: list[str | None] | None = None,
                    got_devices: list[str | None] | None = None) -> list[OutputCheck]:
    """Check every expected output against the candidate's output at the same position."""
    checks = [_compare_one(i, exp, got[i] if i < len(got) else None, atol, rtol) for i, exp in enumerate(expected)]
    exp_dev, got_dev = expected_devices or [], got_devices or []
    checks = [_with_devices(c, exp_dev[i] if i < len(exp_dev) else None, got_dev[i] if i < len(got_dev) else None)
              for i, c in enumerate(checks)]
    if len(got) > len(expected) and checks:
        extra = f"{len(got) - len(expected)} extra output(s) beyond the reference's {len(expected)}"
        checks[-1] = checks[-1].model_copy(update={"correct": False, "problems": checks[-1].problems + [extra]})
    return checks
