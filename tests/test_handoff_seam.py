"""How outputs cross from the candidate's process to the judge's (`kforge.tools.harness.handoff`) when the backend
shares its device's memory (issue 18: the harness names no device; NVIDIA's sharing is `kforge.backends._cuda_share`,
run on a GPU by tests/test_gpu_handoff.py). A toy device here keeps its "device memory" in a dict; host tensors go
through a memory file as before. One process plays both sides: this tests the seam, not the isolation."""

from __future__ import annotations

import os

import torch

from kforge.backends import BackendBase, SharedOutput, load_backend
from kforge.tools.harness.handoff import OutputShelf, open_outputs, release_opened


class ToyDevice(BackendBase):
    """Tensors it `place`d are on its device: shared in place by a key (no descriptor), or by a copy sent as a
    memory file, in turn; counts its collections."""

    name = "toy-share"

    def __init__(self) -> None:
        self.memory: dict[str, torch.Tensor] = {}
        self.placed: set[int] = set()
        self.collected = 0

    def place(self, t: torch.Tensor) -> torch.Tensor:
        self.placed.add(t.data_ptr())
        return t

    def share_output(self, out):
        if out.data_ptr() not in self.placed:
            return None
        if len(self.memory) % 2 == 0:  # in place: the judge reads this very tensor
            key = f"t{len(self.memory)}"
            self.memory[key] = out
            return SharedOutput({"key": key}, keep=out)
        fd = os.memfd_create("toy")
        data = out.contiguous().numpy().tobytes()
        os.write(fd, data)
        self.memory[f"copy{len(self.memory)}"] = out
        return SharedOutput({"nbytes": len(data)}, fd=fd)

    def open_output(self, fields, dtype, shape, fd):
        if fd is None:
            return self.memory[fields["key"]]
        return torch.frombuffer(bytearray(os.pread(fd, fields["nbytes"], 0)), dtype=dtype).view(shape)

    def collect_shared(self):
        self.collected += 1


def _send(shelf: OutputShelf, outputs: list) -> tuple[list[dict], list[int]]:
    descriptors = shelf.put(outputs)
    return descriptors, shelf.take_outgoing()


def test_device_outputs_are_the_backends_to_share_and_host_outputs_go_in_a_memory_file():
    device = ToyDevice()
    shelf = OutputShelf(device)
    on_device = [device.place(torch.arange(6.0).view(2, 3)), device.place(torch.ones(4))]
    host = torch.full((3,), 7.0)
    descriptors, fds = _send(shelf, [*on_device, host, "not a tensor"])
    assert [d.get("kind") for d in descriptors] == ["device", "fd", "fd", None]
    assert descriptors[1]["memory"] == "device" and "memory" not in descriptors[2]  # the host one is the harness's
    assert shelf.in_place  # the first is the candidate's own memory: kept until clear
    got = open_outputs(descriptors, fds, device)
    assert got[0] is device.memory["t0"] and torch.equal(got[0], on_device[0]) and torch.equal(got[1], on_device[1])
    assert torch.equal(got[2], host) and got[3].type_name == "str"
    del got
    release_opened(device)
    shelf.clear()
    assert device.collected == 2 and not shelf.in_place and not shelf.held  # the judge's release, then the clear
    for fd in fds:
        os.close(fd)


def test_a_device_output_without_a_backend_to_open_it_is_refused():
    device = ToyDevice()
    descriptors, fds = _send(OutputShelf(device), [device.place(torch.ones(2))])
    try:
        open_outputs(descriptors, fds)
    except ValueError as exc:
        assert "no backend to open it" in str(exc)
    else:
        raise AssertionError("opened a device output without its backend")


def test_the_cpu_backend_shares_nothing_itself():
    cpu = load_backend("cpu")
    shelf = OutputShelf(cpu)
    descriptors, fds = _send(shelf, [torch.arange(5)])
    assert descriptors[0]["kind"] == "fd" and "memory" not in descriptors[0] and not shelf.in_place
    assert torch.equal(open_outputs(descriptors, fds, cpu)[0], torch.arange(5))
    shelf.clear()
    for fd in fds:
        os.close(fd)
