"""The fused compare (`harness/compare_kernel.py`, one Triton kernel a chunk, for float32 outputs) gives the checks that
the torch passes give, on the cases that tell them apart: chunked or not, verdict-only or not, with and without a float64
truth, NaN or Inf in the reference, the candidate or the truth; outputs of other dtypes (half precision, a candidate's
output of another dtype read as the expected one) are left to the torch passes. Here it runs under Triton's
interpreter on CPU tensors, in a process of its own (the interpreter is chosen before Triton is imported);
`test_gpu_compare_kernel.py` runs the same cases on a GPU.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from .test_compare import CASE_VERDICTS, compare_cases

# Where sums are taken in another order (per block, then over blocks) the relative errors agree to rounding.
_SUM_FIELDS = {"rel_error", "reference_rel_error"}


def _differences(a: dict, b: dict, path: str = "") -> list[str]:
    """Where two checks (as dicts) differ, the relative errors to rounding."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return [d for k in a for d in _differences(a[k], b[k], f"{path}.{k}")]
    if path.rsplit(".", 1)[-1] in _SUM_FIELDS | {"rel_error_bound"} and isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300) else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def same_checks(device: str, fused: str) -> dict:
    """Compare every case with the fused kernel (`fused`: "gpu" or "interpret") and with the torch passes alone, in
    chunks of the kernel's size and of a few elements, verdict-only and not. Returns the differences, the verdicts,
    and how many chunks the kernel compared (0 would mean it never ran)."""
    import kforge.tools.harness.compare as compare
    from kforge.tools.harness import compare_kernel

    launches = 0
    original = compare_kernel.chunk_quantities

    def counted(*args, **kwargs):
        nonlocal launches
        launches += 1
        return original(*args, **kwargs)

    saved = compare._CHUNK, compare._FUSED_CHUNK, compare._FUSED
    compare_kernel.chunk_quantities = counted
    differences, verdicts = [], []
    try:
        for chunk in (None, 1000):
            if chunk:
                compare._CHUNK = compare._FUSED_CHUNK = chunk
            for verdict_only in (False, True):
                runs = {}
                for mode in (fused, "off"):
                    compare._FUSED = mode
                    runs[mode] = [compare.compare_outputs([x], [y], exact=[t] if t is not None else None,
                                                          device=device, verdict_only=verdict_only,
                                                          read_as_expected=True)[0]
                                  for x, y, t in compare_cases(device, 3000)]
                for k, (a, b) in enumerate(zip(runs[fused], runs["off"])):
                    differences += [f"chunk={chunk} verdict_only={verdict_only} case {k}: {d}"
                                    for d in _differences(a.model_dump(), b.model_dump())]
                verdicts = [c.correct for c in runs["off"]]
    finally:
        compare._CHUNK, compare._FUSED_CHUNK, compare._FUSED = saved
        compare_kernel.chunk_quantities = original
    return {"differences": differences, "verdicts": verdicts, "launches": launches}


def test_the_fused_compare_gives_what_the_torch_passes_give_under_the_interpreter():
    pytest.importorskip("triton")
    code = ("import json; from kforge.tests.test_compare_kernel import same_checks; "
            "print(json.dumps(same_checks('cpu', 'interpret')))")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["differences"] == []
    # Cases 8-9 (integers) and 11-14 (other dtypes) are not the kernel's; the other 11 are, in each of the 4 settings,
    # in 1 or 3 chunks.
    assert result["launches"] >= 4 * 11
    assert result["verdicts"] == CASE_VERDICTS


def test_where_the_kernel_cannot_compare_the_torch_pass_does():
    from kforge.tools.harness import compare

    e = torch.randn(10)
    assert compare._fused_kernel(e, e, None, "cpu") is None  # a CPU device without the interpreter
    with pytest.MonkeyPatch.context() as m:
        m.setattr(compare, "_FUSED", "interpret")
        pytest.importorskip("triton")
        assert compare._fused_kernel(e, e, None, "cpu") is not None
        assert compare._fused_kernel(e, e, e.double(), "cpu") is not None
        # Only float32 outputs, with a float64 truth or none: the one build a worker makes ahead.
        assert compare._fused_kernel(torch.arange(10), torch.arange(10), None, "cpu") is None
        assert compare._fused_kernel(e, e.bfloat16(), None, "cpu") is None
        assert compare._fused_kernel(e.half(), e.half(), None, "cpu") is None
        assert compare._fused_kernel(e, e, e, "cpu") is None
        m.setattr(compare, "_FUSED", "off")
        assert compare._fused_kernel(e, e, None, "cpu") is None


def test_a_fused_kernel_that_fails_leaves_the_compare_to_torch(monkeypatch, capsys):
    """A kernel that cannot build or run on this host (its toolchain, a sandbox) costs no verdict: the torch passes
    compare, the worker's log says why once, and the pool hears it with the warm worker (`compare_kernel_failures`)."""
    pytest.importorskip("triton")
    from kforge.tools.harness import compare, compare_kernel

    def broken(*args, **kwargs):
        raise RuntimeError("ptxas not found")

    monkeypatch.setattr(compare, "_FUSED", "interpret")
    monkeypatch.setattr(compare, "_FUSED_FAILED", [])
    monkeypatch.setattr(compare_kernel, "chunk_quantities", broken)
    e = torch.randn(100)
    wrong = e.clone()
    wrong[7] += 1.0
    assert compare.compare_outputs([e], [e + 1e-6])[0].correct
    [check] = compare.compare_outputs([e], [wrong])
    assert not check.correct and check.mismatches == 1
    assert compare.compare_kernel_failures() == ["RuntimeError: ptxas not found"]
    assert capsys.readouterr().err.count("fused output compare failed") == 1
    assert compare._fused_kernel(e, e, None, "cpu") is None  # not tried again in this process
