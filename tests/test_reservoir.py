"""The timed-output reservoir the judge revalidates: what it keeps is what each sampled call returned, even when
a candidate writes every call into one buffer, and its copies reuse the memory taken at the first call."""
import torch

from kforge.tools.harness.bench import _Reservoir


def test_kept_copies_hold_each_calls_values_when_the_candidate_reuses_its_output_buffer():
    keep, shared = _Reservoir(4), torch.empty(256)
    for call in range(200):
        keep.offer(call % 3, shared.fill_(float(call)))  # one buffer, overwritten by every call
    kept = keep.items()
    assert len(kept) in (4, 5) and kept[-1][0] == 199  # 4 sampled and the last (which may be one of them)
    for call, (set_index, outputs) in kept:
        assert set_index == call % 3
        value = outputs.flatten()[0].item() if call == 199 else outputs[0].flatten()[0].item()
        assert value == float(call)


def test_copies_reuse_the_memory_taken_at_the_first_call():
    keep = _Reservoir(4)
    keep.offer(0, torch.zeros(64))
    buffers = {outs[0].data_ptr() for _, outs in keep.kept.values()} | {outs[0].data_ptr() for outs in keep.free}
    assert len(buffers) == 4
    for call in range(1, 500):
        keep.offer(0, torch.full((64,), float(call)))
        assert {outs[0].data_ptr() for _, outs in keep.kept.values()} <= buffers
    assert len(keep.kept) == 4 and keep.seen == 500
    sampled = [call for call in keep.kept]
    assert any(call >= 8 for call in sampled)  # replaced after filling (chance all 4 stay in the first 8: ~1e-7)


def test_an_output_of_another_shape_is_copied_anew():
    keep = _Reservoir(2)
    keep.offer(0, torch.zeros(8))
    keep.offer(1, torch.ones(3, 5))  # a set of another shape fills the second slot with a new copy
    shapes = sorted(tuple(outs[0].shape) for _, outs in keep.kept.values())
    assert shapes == [(3, 5), (8,)]
    assert keep.kept[1][1][0].sum().item() == 15


def test_outputs_too_large_to_keep_leave_only_the_last():
    from kforge.tools.harness import bench

    keep = _Reservoir(8)
    big = torch.empty(bench._KEPT_OUTPUT_BYTES // 4 + 1)  # float32: one byte over the budget
    keep.offer(0, big)
    assert keep.k == 0 and keep.free == [] and [c for c, _ in keep.items()] == [0]
