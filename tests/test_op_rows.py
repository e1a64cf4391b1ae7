"""Op rows from torch.profiler events: device totals must not count a labelled range twice.

The events mirror what torch 2.11 reported on the H200 for tests/data/known_bottlenecks/launch_chain
(its torch_table.txt): a `record_function` range appears twice, once on the host and once on the
device as a user annotation spanning the kernels it launched.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kforge.profilers.torch_profiler import custom_share, rows_from_events


def event(key, *, device=0.0, cpu_self=0.0, cpu_total=0.0, count=120, annotation=False):
    return SimpleNamespace(key=key, count=count, self_cpu_time_total=cpu_self, cpu_time_total=cpu_total,
                           self_device_time_total=device, is_user_annotation=annotation)


RANGE = "kforge::kf_kb_step_chain.step_cuda"


def test_device_annotation_of_a_range_is_not_added_to_the_total():
    events = [event("step(float const*, float*, int)", device=108.544),
              event(RANGE, device=108.544, annotation=True),
              event(RANGE, cpu_self=1023.0, cpu_total=3930.0, annotation=True),
              event("aten::empty_like", cpu_self=113.7, cpu_total=546.0),
              event("cudaLaunchKernel", cpu_self=574.2, cpu_total=574.2)]
    rows, total, basis = rows_from_events(events, custom_kernels=["step"])
    assert basis == "device" and total == pytest.approx(108.544)
    kernel = next(r for r in rows if r.name.startswith("step("))
    assert kernel.share == pytest.approx(1.0) and kernel.is_custom
    assert not any(r.name.startswith(("aten::", "cuda")) for r in rows), "host-only rows carry no device time"
    assert custom_share(rows, total, basis) == pytest.approx(1.0)


def test_library_kernels_launched_inside_the_range_count_as_the_candidates():
    # The extension calls cuBLAS (a kernel it did not build); the framework adds one kernel of its own.
    events = [event("sm90_xmma_gemm_f32f32_tf32", device=80.0, count=5),
              event(RANGE, device=80.0, count=5, annotation=True),
              event(RANGE, cpu_self=40.0, cpu_total=90.0, count=5, annotation=True),
              event("void at::native::vectorized_elementwise_kernel<4>", device=20.0, count=5)]
    rows, total, basis = rows_from_events(events, custom_kernels=["step"])
    assert total == pytest.approx(100.0)
    assert custom_share(rows, total, basis) == pytest.approx(0.8)


def test_cpu_basis_keeps_host_times():
    events = [event(RANGE, cpu_self=50.0, cpu_total=400.0, count=5, annotation=True),
              event("aten::add", cpu_self=350.0, cpu_total=350.0, count=5)]
    rows, total, basis = rows_from_events(events)
    assert basis == "cpu" and total == pytest.approx(400.0)
    assert custom_share(rows, total, basis) == pytest.approx(1.0)  # the range's total covers the add it called


def test_the_op_table_counts_device_launches_and_none_on_the_cpu():
    """`collect_op_table` over real calls: rows on the host's basis, and no device launches where there is no device
    (a GPU's count is checked by tests/test_gpu_cuda.py: one kernel a call for the example, hundreds for a chain)."""
    import torch

    from kforge.backends import load_backend
    from kforge.profilers.torch_profiler import collect_op_table

    backend = load_backend("cpu")
    x = torch.randn(64, 64)
    table = collect_op_table(lambda t: torch.relu(t) + 1, lambda i: (x,), backend, calls=3, trace_path=None)
    assert table.basis == "cpu" and table.device_launches == 0
    relu = next(r for r in table.rows if r.name == "aten::relu")
    assert relu.calls == 3


def test_an_ops_device_time_is_not_added_to_its_kernels():
    """torch.profiler gives an aten op the device time of the kernels it launched, and each kernel a row of its own:
    the device total counts the kernels once (summed with the ops it read 2x the timed median of device-bound
    KernelBench networks on an H200, 2026-12-01). The op's row keeps its device time and reads its share of the call."""
    cpu, cuda = SimpleNamespace(name="CPU"), SimpleNamespace(name="CUDA")
    events = [SimpleNamespace(**vars(event("aten::mm", device=80.0, cpu_self=10.0, cpu_total=12.0, count=5)),
                              device_type=cpu),
              SimpleNamespace(**vars(event("sm90_xmma_gemm_f32f32", device=80.0, count=5)), device_type=cuda),
              SimpleNamespace(**vars(event("aten::relu", device=20.0, cpu_self=5.0, cpu_total=6.0, count=5)),
                              device_type=cpu),
              SimpleNamespace(**vars(event("void at::native::vectorized_elementwise_kernel<4>", device=20.0, count=5)),
                              device_type=cuda),
              SimpleNamespace(**vars(event("cudaLaunchKernel", cpu_self=30.0, cpu_total=30.0, count=10)),
                              device_type=cpu)]
    rows, total, basis = rows_from_events(events)
    assert basis == "device" and total == pytest.approx(100.0)
    shares = {r.name: r.share for r in rows}
    assert shares["sm90_xmma_gemm_f32f32"] == pytest.approx(0.8) and shares["aten::mm"] == pytest.approx(0.8)
