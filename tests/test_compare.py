"""The judge's comparison: tolerances per dtype, located mismatches, NaN/Inf, shapes and types."""

import pytest
import torch

from kforge.tools.harness.compare import compare_outputs, tolerance_for


def test_float32_within_tolerance_passes():
    e = torch.randn(64, 64)
    [check] = compare_outputs([e], [e + 5e-6])
    assert check.correct and check.mismatches == 0 and check.max_abs_error == pytest.approx(5e-6, rel=0.05)
    assert check.tolerance.atol == 1e-4 and "KernelBench" in check.tolerance.why


def test_mismatch_is_counted_and_located():
    e = torch.zeros(4, 5)
    g = e.clone()
    g[2, 3] = 1.0
    g[3, 0] = -2.0
    [check] = compare_outputs([e], [g])
    assert not check.correct and check.mismatches == 2 and check.numel == 20
    assert check.first_mismatches[0].index == [2, 3] and check.first_mismatches[0].got == 1.0
    assert check.max_abs_error == 2.0


def test_nan_and_inf_are_reported():
    e = torch.tensor([1.0, float("nan"), float("inf"), 4.0])
    g = torch.tensor([float("nan"), float("nan"), float("inf"), float("inf")])
    [check] = compare_outputs([e], [g])
    assert not check.correct and check.mismatches == 2
    assert check.nan_count == 1 and check.inf_count == 1


def test_an_infinite_reference_is_matched_only_by_the_same_infinity():
    """Its tolerance (atol + rtol x inf) is infinite, and so is any difference from it: without a rule of its own, a
    finite value or the other infinity passed where the reference is infinite (torch.isclose fails them)."""
    e = torch.tensor([float("inf"), float("-inf"), float("inf"), 1.0])
    g = torch.tensor([1e30, float("inf"), float("inf"), 1.0])
    [check] = compare_outputs([e], [g])
    assert not check.correct and check.mismatches == 2
    assert [m.index for m in check.first_mismatches] == [[0], [1]]


def test_shape_dtype_and_type_problems():
    e = torch.ones(3, 4)
    assert "shape [4, 3]" in compare_outputs([e], [torch.ones(4, 3)])[0].problems[0]
    assert "dtype float64" in compare_outputs([e], [torch.ones(3, 4, dtype=torch.float64)])[0].problems[0]
    assert not compare_outputs([e], [])[0].correct
    extra = compare_outputs([e], [e, e])
    assert not extra[0].correct and "extra output" in extra[0].problems[-1]


def test_tolerances_by_dtype_and_override():
    assert tolerance_for(torch.bfloat16).atol == 1e-2
    assert tolerance_for(torch.int32).atol == 0 and "exactly" in tolerance_for(torch.int32).why
    custom = tolerance_for(torch.float32, atol=1e-3)
    assert custom.atol == 1e-3 and custom.rtol == 1e-4 and "set by the caller" in custom.why


def test_output_on_the_wrong_device_fails():
    e = torch.ones(2, 2)
    [check] = compare_outputs([e], [e.clone()], expected_devices=["cuda:0"], got_devices=["cpu"])
    assert not check.correct and "device cpu != expected cuda:0" in check.problems
    assert check.got.device == "cpu" and check.expected.device == "cuda:0"
    [same] = compare_outputs([e], [e.clone()], expected_devices=["cuda:0"], got_devices=["cuda:0"])
    assert same.correct and same.got.device == "cuda:0"


def test_a_chunked_pass_finds_what_one_pass_finds(monkeypatch):
    """Large outputs are compared chunk by chunk; the counts, maxima, first mismatches (with their
    indices in the output's shape) and relative errors do not depend on where the chunks fall."""
    import kforge.tools.harness.compare as compare

    torch.manual_seed(0)
    e = torch.randn(7, 13)
    g = e.clone()
    g[0, 3] += 1.0
    g[4, 0] = float("nan")
    g[6, 12] = float("inf")
    g[2, 5] += 1e-3
    exact = e.double() + 1e-9
    whole = compare_outputs([e], [g], exact=[exact])[0]
    monkeypatch.setattr(compare, "_CHUNK", 5)
    chunked = compare_outputs([e], [g], exact=[exact])[0]
    assert chunked.mismatches == whole.mismatches == 4
    assert [m.index for m in chunked.first_mismatches] == [[0, 3], [2, 5], [4, 0], [6, 12]]
    assert (chunked.nan_count, chunked.inf_count) == (1, 1)
    assert chunked.max_abs_error == whole.max_abs_error == pytest.approx(1.0)
    assert chunked.rel_error == pytest.approx(whole.rel_error)
    assert chunked.reference_rel_error == pytest.approx(whole.reference_rel_error)


def test_the_reduced_precision_hint_only_where_it_could_explain_the_error():
    torch.manual_seed(0)
    e = torch.randn(64, 64)
    near = compare_outputs([e], [e * (1 + 1e-3)], exact=[e.double()])[0]  # 1e-3: what TF32 or bf16 would do
    wrong = compare_outputs([e], [e * 0.4], exact=[e.double()])[0]  # 0.6: a wrong kernel
    assert not near.correct and any("reduced-precision" in p for p in near.problems)
    assert not wrong.correct and not any("reduced-precision" in p for p in wrong.problems)


def test_a_bfloat16_output_read_as_float32_judges_as_its_float32_copy():
    """The judge's bfloat16 null is compared without a float32 copy of its output: the same verdict, errors and
    counts as the copy, and a dtype problem only where it is not asked for."""
    e = torch.randn(3000, 700)
    got = (e.to(torch.bfloat16) @ torch.eye(700, dtype=torch.bfloat16))  # a reduced-precision result
    [read] = compare_outputs([e], [got], read_as_expected=True)
    [copied] = compare_outputs([e], [got.to(torch.float32)])
    assert not copied.correct and read.model_dump(exclude={"got"}) == copied.model_dump(exclude={"got"})
    [strict] = compare_outputs([e], [got])
    assert any("dtype" in p for p in strict.problems)
    [ints] = compare_outputs([torch.ones(4, dtype=torch.int64)], [torch.ones(4)], read_as_expected=True)
    assert not ints.correct and any("dtype" in p for p in ints.problems)  # only floats are read across dtypes


def test_a_few_elements_just_past_atol_with_the_norm_in_bounds_are_named_a_summation_order_effect():
    """An honest sequential float32 column sum (2048 terms) failed atol=1e-4 by 1.3e-4 at a near-zero sum: still
    wrong by KernelBench's rule, but the result says what it likely is and what to do; a kernel off by 1 at one
    element is not given that reading."""
    torch.manual_seed(0)
    e = torch.randn(2048) * 45  # column sums of 2048 randn rows
    e[[3, 700]] = 0.0
    order = e.clone()
    order[[3, 700]] = 1.3e-4
    broken = e.clone()
    broken[5] += 1.0
    [near] = compare_outputs([e], [order], exact=[e.double()])
    [wrong] = compare_outputs([e], [broken], exact=[e.double()])
    assert not near.correct and near.mismatches == 2
    assert any("summation order" in p for p in near.problems), near.problems
    assert not wrong.correct and not any("summation order" in p for p in wrong.problems), wrong.problems


def test_a_verdict_only_compare_gives_the_full_verdict_and_stops_at_the_first_wrong_chunk(monkeypatch):
    """The judge's nulls ask only whether they would pass: a wrong output is judged at its first wrong chunk, with the
    full compare's verdict, whatever makes it wrong (a value, NaN, Inf, the norm)."""
    import kforge.tools.harness.compare as compare

    monkeypatch.setattr(compare, "_CHUNK", 5)
    torch.manual_seed(0)
    e = torch.randn(40)
    cases = {"right": e + 1e-6, "zeros": torch.zeros_like(e), "nan late": e.clone(), "inf late": e.clone(),
             "one value late": e.clone()}
    cases["nan late"][37] = float("nan")
    cases["inf late"][38] = float("inf")
    cases["one value late"][39] += 1.0
    passes = []
    for name, g in cases.items():
        [full] = compare_outputs([e], [g])
        [quick] = compare_outputs([e], [g], verdict_only=True)
        assert quick.correct == full.correct, name
        assert (quick.mismatches == 0) == (full.mismatches == 0 and not full.nan_count and not full.inf_count), name
        passes.append(quick.correct)
    assert passes == [True, False, False, False, False]
    [zeros] = compare_outputs([e], [torch.zeros_like(e)], verdict_only=True)
    assert zeros.mismatches == 5 and zeros.numel == 40 and "first 5 elements" in zeros.problems[0]  # its first chunk only
    [right] = compare_outputs([e], [e + 1e-6], verdict_only=True)
    assert right.max_abs_error == pytest.approx(1e-6, rel=0.05) and right.rel_error is not None  # the full pass


def compare_cases(device: str = "cpu", n: int = 97) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """(reference, candidate, float64 truth or None): the outputs that tell the compare's passes apart, `CASE_VERDICTS`
    their verdicts (also the fused kernel's cases, `test_compare_kernel.py`)."""
    torch.manual_seed(0)
    e = torch.randn(n, device=device)
    wrong, nan_both, inf_both, inf_got = e + 1e-6, e.clone(), e.clone(), e.clone()
    wrong[[3, 50, n - 1]] += torch.tensor([1.0, -2e-3, 5e-4], device=device)
    nan_both[10] = float("nan")
    inf_both[20] = float("inf")
    inf_got[30] = float("-inf")
    g_nan, g_inf = e.clone(), inf_both.clone()
    g_nan[10] = float("nan")
    truth, truth_inf = e.double() + 1e-9, e.double()
    truth_inf[5] = float("inf")
    ints = torch.arange(n, device=device)
    return [(e, e + 1e-6, None), (e, wrong, None), (e, wrong, truth), (nan_both, g_nan, None), (inf_both, g_inf, None),
            (e, inf_got, truth), (e, e + 1e-6, truth_inf), (e, torch.zeros_like(e), truth), (ints, ints, None),
            (ints, ints.flip(0), None), (e * 1e-30, e * 1e-30 + 1e-6, None), (e.half(), (e + 3e-3).half(), None),
            (e.bfloat16(), e.bfloat16(), None), (e.double(), e.double() + 1e-13, None), (e, e.bfloat16(), None),
            (inf_both, e, None), (inf_both, -inf_both, None)]


# (case 10: every element within atol, its norm 1e24 times the output's own: wrong; 14: bfloat16, read as float32 or
# not, is off by up to 2^-9 relative; 15-16: an infinite reference is matched by nothing but the same infinity)
CASE_VERDICTS = [True, False, False, True, True, False, True, False, True, False, False, True, True, True, False, False,
                 False]


def test_the_pass_for_finite_outputs_gives_what_the_masked_pass_gives(monkeypatch):
    """Most outputs hold no NaN or Inf, and their compare skips the masks those need (`_Pass.finite`); it must give
    the very check the masked pass gives, chunk by chunk or not, with a float64 truth or not, and an output with a
    NaN or Inf anywhere (in the reference, the candidate or the truth) must be compared by the masked pass."""
    import kforge.tools.harness.compare as compare

    cases = compare_cases()
    for chunk in (1 << 24, 7):
        monkeypatch.setattr(compare, "_CHUNK", chunk)
        for verdict_only in (False, True):
            quick = [compare_outputs([x], [y], exact=[t] if t is not None else None, verdict_only=verdict_only)[0]
                     for x, y, t in cases]
            with monkeypatch.context() as m:
                m.setattr(compare, "_FINITE_FIRST", False)  # the masked pass alone
                full = [compare_outputs([x], [y], exact=[t] if t is not None else None, verdict_only=verdict_only)[0]
                        for x, y, t in cases]
            for k, (a, b) in enumerate(zip(quick, full)):
                assert a == b, (chunk, verdict_only, k, a, b)
    assert [c.correct for c in quick] == CASE_VERDICTS
