"""The device-specific pieces the harness asks of its backend (issue 18): the allocator's memory and the fault test.

The harness used to ask `device.startswith("cuda")` and torch.cuda directly; now a backend answers, so a new device
brings its own allocator. The GPU side (torch's CUDA allocator) is run by tests/test_gpu_pool.py and test_gpu_cuda.py.
"""

from __future__ import annotations

import pytest

from kforge.backends import BackendBase, backend_class, is_device_fault, is_out_of_memory
from kforge.backends._nvidia import CudaAllocator
from kforge.tools.harness import worker
from kforge.tools.harness.handoff import reserved_device_bytes, return_free_memory


class FakeAllocator(BackendBase):
    """A device whose allocator holds `reserved` bytes, `allocated` of them in use; counts its releases."""

    name = "fake"

    def __init__(self, reserved: int, allocated: int) -> None:
        self.reserved, self.allocated, self.released, self.resets = reserved, allocated, 0, 0

    def allocator_memory(self) -> tuple[int, int]:
        return (self.reserved, self.allocated)

    def release_cached_memory(self) -> None:
        self.released += 1
        self.reserved = self.allocated

    def reset_memory_peaks(self) -> bool:
        self.resets += 1
        return True

    def memory_peaks(self) -> list[int]:
        return [self.reserved, self.allocated]


def test_free_memory_goes_back_only_beyond_what_is_kept():
    dev = FakeAllocator(reserved=3 << 30, allocated=1 << 30)  # 2 GiB cached free
    return_free_memory(dev, keep_bytes=2 << 30)
    assert dev.released == 0  # exactly at the limit: kept
    return_free_memory(dev, keep_bytes=(2 << 30) - 1)
    assert dev.released == 1 and reserved_device_bytes(dev) == 1 << 30
    return_free_memory(dev, keep_bytes=0)
    assert dev.released == 1  # nothing cached any more: nothing to give back


def test_a_host_memory_device_holds_no_device_memory():
    cpu = backend_class("cpu")()
    assert cpu.allocator_memory() == (0, 0) and reserved_device_bytes(cpu) == 0
    assert cpu.reset_memory_peaks() is False
    assert worker._device_memory_around_op(cpu)() == {}
    assert worker._device_memory_around_op(None)() == {}  # a probe worker has no backend


def test_an_op_reports_the_allocators_peaks_and_returns_its_cache():
    dev = FakeAllocator(reserved=5 << 30, allocated=1 << 30)
    after = worker._device_memory_around_op(dev)
    assert dev.resets == 1
    assert after() == {"device_peak_bytes": [5 << 30, 1 << 30]}
    assert dev.released == 1  # 4 GiB cached beyond the worker's keep


def test_the_cuda_allocator_does_not_start_cuda_to_answer():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_initialized():
        pytest.skip("CUDA already started in this process")
    for name in ("cuda", "triton"):
        cls = backend_class(name)
        assert issubclass(cls, CudaAllocator)
        dev = cls.__new__(cls)  # constructing may probe the device; the memory methods need no state
        assert dev.allocator_memory() == (0, 0) and dev.reset_memory_peaks() is False
        dev.release_cached_memory()
    assert not torch.cuda.is_initialized()


def test_device_faults_are_the_backends_own_or_any_registered():
    text = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert is_device_fault(text, backend_class("cuda"))
    assert not is_device_fault(text, backend_class("cpu"))  # a CPU backend names no device faults
    assert is_device_fault(text)  # no backend given: any registered backend's markers
    assert not is_device_fault("ValueError: shapes do not match")
    assert is_out_of_memory("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert not is_out_of_memory(text)


def test_the_fork_servers_guard_is_a_class_fact_of_the_backend():
    """The fork server's guard against starting the device while it imports is a class fact of the backend (NVIDIA's:
    torch.cuda.is_available() through NVML), set in the zygote and dropped by each fork before its job's environment;
    a CPU-like backend has none and never started a device."""
    guard = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    assert backend_class("cuda").fork_server_env == guard and backend_class("triton").fork_server_env == guard
    assert backend_class("cpu").fork_server_env == {} and BackendBase.device_started_here() is False
    assert worker._fork_server_env("cuda") == guard  # what the zygote sets, by the backend's name
    assert not backend_class("cuda").device_started_here()  # this test process never started CUDA


def test_the_timer_functions_and_numerics_flags_watched_are_the_backends(monkeypatch):
    """A candidate that rebinds its device's synchronize or flips its TF32 flag is caught on that device (NVIDIA's
    `watched_functions`, `numerics_flags`); torch's own and the clocks are watched on every device."""
    import time

    import torch

    from kforge.tools.harness.integrity import HarnessSnapshot

    on_gpu, on_cpu = HarnessSnapshot(backend_class("cuda")), HarnessSnapshot(backend_class("cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    assert on_gpu.tampering() == ["time.perf_counter was replaced", "torch.cuda.synchronize was replaced"]
    assert on_cpu.tampering() == ["time.perf_counter was replaced"]
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = not cudnn_tf32
    try:
        assert [f.split(":")[0] for f in on_gpu.flag_changes()] == ["torch.backends.cudnn.allow_tf32"]
        assert on_cpu.flag_changes() == []
    finally:
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
    monkeypatch.setattr(torch, "get_default_dtype", lambda: torch.float64)
    assert [f.split(":")[0] for f in on_cpu.flag_changes()] == ["torch.get_default_dtype()"]


def test_the_toolchains_a_sandbox_may_read_are_named_by_the_backends(monkeypatch):
    """The sandbox lets a worker read the toolchains' directories that some backend names (NVIDIA's CUDA_HOME and
    CUDA_PATH), as this environment sets them; it names no toolkit itself."""
    from kforge.backends import toolchain_homes

    monkeypatch.setenv("CUDA_HOME", "/opt/toolkit-a")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert backend_class("cuda").toolchain_env_names == ("CUDA_HOME", "CUDA_PATH")
    assert backend_class("cpu").toolchain_env_names == ()
    assert toolchain_homes() == ["/opt/toolkit-a"]
    monkeypatch.setenv("CUDA_PATH", "/opt/toolkit-b")
    assert toolchain_homes() == ["/opt/toolkit-a", "/opt/toolkit-b"]


@pytest.mark.parametrize(("footprint_gb", "capacity_gb", "beside"), [
    (0.2, 80, True),    # a small problem: the nulls run beside the trial (the time it saves)
    (4.3, 80, False),   # KernelBench's MaxPool2d on an H100: over 1/32 of the device
    (4.3, 141, False),  # the same on an H200: under 1/32, but over the 1 GiB that running beside may add
    (1.5, 141, False),
    (0.9, 16, False),   # a small device: its share holds it back
])
def test_the_judges_nulls_run_beside_a_trial_only_on_a_small_problem(footprint_gb, capacity_gb, beside):
    """Whether calibration runs beside the candidate's trial (both processes then hold a trial's inputs, outputs and
    workspace at once) is bounded by the problem's own size, not only by the device's: on a 141 GB H200 a share
    alone let MaxPool2d's verify reach 4.75x its footprint."""
    from kforge.tools.process.protocol import PrepareReply
    from kforge.tools.trials import calibrate_beside_trial

    def prepared(footprint: int | None) -> PrepareReply:
        return PrepareReply(expected=[], distribution="native", exact=False, reference_call_s=0.01,
                            footprint_bytes=footprint, capacity_bytes=int(capacity_gb * 1e9))

    assert calibrate_beside_trial(prepared(int(footprint_gb * 1e9))) is beside
    assert calibrate_beside_trial(prepared(None)) is False
