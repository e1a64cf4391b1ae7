"""The built-in analyst on real profiler output of kernels whose bottleneck is known.

The captures in tests/data/known_bottlenecks/ were taken on an NVIDIA H200 (bench/capture_profiles.py,
see that folder's README): KForge's normalized report, ncu's details page (text and CSV) and
torch.profiler's table for the same profiled calls. Each source must lead to the known diagnosis, or,
where it cannot hold the facts (a torch.profiler table says nothing about memory vs compute), to an
honest 'unknown' that asks for counters instead of a wrong guess.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kforge.profilers.analyst import load_provider, parse_profile_text
from kforge.profilers.report import ProfileReport

CASES = Path(__file__).parent / "data" / "known_bottlenecks"

# case -> (bottleneck, words the why must hold, rank-1 title, words in the rank-1 action)
KNOWN = {
    "uncoalesced_transpose": ("memory-bound", "uncoalesced", "Coalesce the hot kernel's global accesses", "shared memory"),
    "naive_matmul": ("memory-bound", "re-reads the same data from cache", "Reuse data in registers and shared memory",
                     "tensor cores"),
    "dram_elementwise": ("memory-bound", "DRAM Throughput", None, "fewer bytes"),
    "launch_chain": ("launch-bound", "", None, "one"),
}


def analyse(case: str, source: str):
    code = (CASES / case / "candidate.py").read_text()
    rules = load_provider("rules")
    if source == "report":
        report = ProfileReport(**json.loads((CASES / case / "report.json").read_text()))
        return rules.analyze(report, code=code)
    text = (CASES / case / source).read_text()
    assert parse_profile_text(text) is not None, f"{case}/{source} not recognized"
    return rules.analyze(None, text=text, code=code)


@pytest.mark.parametrize("source", ["report", "ncu_details.txt", "ncu_details.csv"])
@pytest.mark.parametrize("case", sorted(KNOWN))
def test_known_bottleneck_is_diagnosed(case, source):
    bottleneck, why_words, title, action_words = KNOWN[case]
    analysis = analyse(case, source)
    assert analysis.bottleneck == bottleneck, analysis.bottleneck_why
    assert why_words in analysis.bottleneck_why
    first = analysis.recommendations[0]
    if title:
        assert first.title == title
    assert action_words in first.action, first.action
    assert first.confidence in ("high", "medium") and first.evidence
    assert first.where and first.where.startswith("line "), "the advice must point into the candidate"


def test_uncoalesced_evidence_cites_ncus_own_rules_and_sectors():
    analysis = analyse("uncoalesced_transpose", "report")
    metrics = {e.metric: e for e in analysis.evidence}
    assert metrics["excessive sectors (uncoalesced)"].value == "78% of all sectors"
    assert metrics["Global Load Sectors Per Request"].value == 32.0
    assert "UncoalescedGlobalAccess" in metrics["excessive sectors (uncoalesced)"].source


def test_coalesced_float4_kernel_is_not_called_uncoalesced():
    # axpy_vec4 reads 16 sectors per request: a coalesced float4 access, not a strided one.
    analysis = analyse("dram_elementwise", "report")
    assert "uncoalesced" not in analysis.bottleneck_why
    assert analysis.recommendations[0].title == "Move fewer bytes: the kernel is at the bandwidth ceiling"
    assert any(e.metric == "bandwidth_fraction" and e.value > 0.8 for e in analysis.evidence)


def test_naive_matmul_is_told_to_tile_and_is_slower_than_eager():
    analysis = analyse("naive_matmul", "report")
    titles = [r.title for r in analysis.recommendations]
    assert titles[:2] == ["Reuse data in registers and shared memory", "Get faster than eager first"]


def test_launch_chain_from_pasted_torch_table():
    analysis = analyse("launch_chain", "torch_table.txt")
    assert analysis.bottleneck == "launch-bound"
    assert "host time, more than" in analysis.bottleneck_why  # cudaLaunchKernel time vs kernel time
    ratio = next(e for e in analysis.evidence if e.metric == "host launch time / kernel time")
    assert ratio.value > 1


@pytest.mark.parametrize("case", ["uncoalesced_transpose", "naive_matmul", "dram_elementwise"])
def test_torch_table_alone_does_not_guess_memory_or_compute(case):
    analysis = analyse(case, "torch_table.txt")
    assert analysis.bottleneck == "unknown"
    assert any("hardware counters" in n for n in analysis.notes)
