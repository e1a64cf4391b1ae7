"""A trial's repeat (the same inputs again after NaN-poisoning memory) whose outputs are bitwise the first run's takes
the first run's checks: comparing them again gave the same verdict and took 0.4 s a trial on a 5 GB output (H200,
KernelBench level1/63). A repeat that differs is compared on its own."""

from __future__ import annotations

from types import SimpleNamespace

from kforge.tools.harness.judge import Judge, _judged_how
from kforge.tools.models import OutputCheck, TensorInfo
from kforge.tools.process import protocol as p


_TENSOR = TensorInfo(kind="tensor", shape=[8], dtype="float32", device="cpu")


def _check(correct: bool, *problems: str) -> OutputCheck:
    return OutputCheck(output=0, correct=correct, expected=_TENSOR, got=_TENSOR, problems=list(problems))


def _judge(verdict: OutputCheck) -> tuple[SimpleNamespace, list]:
    compared: list = []

    def compare(again, judging, devices):
        compared.append(again)
        return [verdict]
    return SimpleNamespace(_compare=compare), compared


def test_a_repeat_bitwise_the_first_run_takes_its_checks_without_a_compare():
    judge, compared = _judge(_check(False, "compared again"))
    first = [_check(True)]
    verdict = Judge._repeat_verdict(judge, ["outputs"], p.Judging(), [None], first)
    assert verdict.repeat_identical and verdict.repeat_correct and verdict.repeat_problems == []
    assert compared == []


def test_a_repeat_that_differs_is_compared_on_its_own():
    judge, compared = _judge(_check(False, "3 of 8 elements differ"))
    verdict = Judge._repeat_verdict(judge, ["outputs"], p.Judging(), [None], None)
    assert not verdict.repeat_identical and not verdict.repeat_correct
    assert verdict.repeat_problems == ["3 of 8 elements differ"] and compared == [["outputs"]]
    # Identical by digest but judged another way than the first run: compared, and still said to be identical.
    verdict = Judge._repeat_verdict(judge, ["outputs"], p.Judging(atol=1.0), [None], None, identical=True)
    assert verdict.repeat_identical and not verdict.repeat_correct and len(compared) == 2


def test_the_first_checks_count_only_under_the_same_tolerances_and_precision():
    assert _judged_how(p.Judging()) == _judged_how(p.CheckRepeatRequest(i=0, record=p.RepeatReply(error="x")))
    assert _judged_how(p.Judging()) != _judged_how(p.Judging(rtol=1e-3))
    assert _judged_how(p.Judging()) != _judged_how(p.Judging(precision="bf16"))


def test_the_judges_whole_output_checks_go_a_chunk_at_a_time_on_views(monkeypatch):
    """`_all_finite` and `_mean64` see every element through views of at most `_CHUNK_ELEMENTS`, whatever the
    strides: a whole-tensor `isfinite` made 13.9 GB of temporaries beside level1/63's 8.6 GB output (H200)."""
    import pytest
    import torch

    from kforge.tools.harness import judge

    monkeypatch.setattr(judge, "_CHUNK_ELEMENTS", 100)
    for shape in [(), (7,), (1000,), (3, 500), (50, 7, 9), (2, 3, 400)]:
        base = torch.randn(shape, dtype=torch.float64)
        for t in (base, base.transpose(0, -1) if base.dim() > 1 else base):
            chunks = list(judge._chunks(t))
            assert all(c.numel() <= 100 or c.dim() == 0 for c in chunks) and sum(c.numel() for c in chunks) == t.numel()
            assert all(c.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for c in chunks)  # views
            assert judge._mean64(t) == pytest.approx(float(t.mean()), abs=1e-12) and judge._all_finite([t])
            for bad in (float("inf"), float("nan")):
                u = t.clone()
                u[tuple(s - 1 for s in u.shape)] = bad  # the last element in index order
                assert not judge._all_finite([torch.ones(3), u])


def test_the_repeat_makes_its_inputs_before_it_poisons_the_allocator(monkeypatch):
    """Made after the poisoning, the inputs took the start of the poisoned block and a large output went to memory of
    its own, which held no NaN (level1/63's repeat reserved 17.4 GB for a 9.9 GB peak, H200)."""
    import torch

    from kforge.tools.harness import candidate

    order: list[str] = []
    monkeypatch.setattr(candidate, "poison_allocator", lambda sizes, backend: order.append(f"poison {sizes}"))
    fake = SimpleNamespace(
        _output_sizes=[64], backend=SimpleNamespace(synchronize=lambda: order.append("sync")),
        sets=SimpleNamespace(fresh=lambda i: order.append(f"inputs {i}") or [torch.ones(16)]),
        model=lambda x: order.append("call") or x * 2)
    out = candidate.Candidate._run_poisoned(fake, 3)
    assert order == ["inputs 3", "poison [64]", "call", "sync"] and torch.equal(out[0], torch.full((16,), 2.0))
