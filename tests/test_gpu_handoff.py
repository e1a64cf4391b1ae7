"""CUDA outputs cross from one sandboxed worker to another as a descriptor of exportable device memory
(`kforge.backends._cuda_share`, asked through the backend): CUDA IPC handles do not open across the workers' PID namespaces (H100, 2026-11-24).
Two fresh processes, each in its own sandbox as workers are, hand tensors over a socket pair (skipped without a
GPU; run by scripts/run_gpu_tests.sh)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

_SIDE = """
import json, os, socket, sys
from kforge.tools.process.sandbox import Confinement, enter
report = enter(Confinement(home={home!r}))
import torch
from kforge.backends import load_backend
from kforge.tools.harness.handoff import OutputShelf, open_outputs
backend = load_backend("cuda")
sock = socket.socket(fileno={fd})
torch.manual_seed(0)
made = [torch.randn(1000, 3, device="cuda"), torch.randn(64, 64, device="cuda").t(),
        torch.arange(10, device="cuda").to(torch.bfloat16), torch.tensor(3.5, device="cuda"),
        torch.empty(0, 5, device="cuda"), torch.ones(4, dtype=torch.bool, device="cuda")]
if {role!r} == "candidate":
    shelf = OutputShelf(backend)
    descriptors = shelf.put(made)
    fds = shelf.take_outgoing()
    socket.send_fds(sock, [json.dumps([report, descriptors]).encode()], fds)
    for fd in fds:
        os.close(fd)
    shelf.clear()
    sock.recv(1)  # the judge is done
else:
    free_before = torch.cuda.mem_get_info()[0]
    msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 64)
    other, descriptors = json.loads(msg)
    got = open_outputs(descriptors, fds, backend)
    out = {{"same": [bool(g.shape == m.shape and g.dtype == m.dtype and torch.equal(g, m)) for g, m in zip(got, made)],
           "kinds": [d["kind"] + ":" + d.get("memory", "") for d in descriptors],
           "missing": report["missing"] + other["missing"]}}
    held = torch.cuda.mem_get_info()[0]
    del got
    for fd in fds:
        os.close(fd)
    out["freed_mib"] = (torch.cuda.mem_get_info()[0] - held) / 2**20
    sock.send(b"x")
    print(json.dumps(out))
"""


def test_cuda_outputs_cross_between_sandboxed_workers(tmp_path) -> None:
    home = str(tmp_path / "home")
    os.makedirs(home)
    a, b = socket.socketpair()
    procs = []
    for role, sock in (("candidate", a), ("judge", b)):
        code = _SIDE.format(home=home, fd=sock.fileno(), role=role)
        procs.append(subprocess.Popen([sys.executable, "-c", code], pass_fds=[sock.fileno()],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    a.close()
    b.close()
    (_, cand_err), (out, judge_err) = (p.communicate(timeout=240) for p in procs)
    assert procs[0].returncode == 0, cand_err
    assert procs[1].returncode == 0, judge_err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["missing"] == [], result["missing"]  # both really were sandboxed (own PID namespaces)
    assert result["kinds"] == ["fd:device"] * 6
    assert result["same"] == [True] * 6  # values, shape and dtype: a transposed view, bf16, a scalar, empty, bool
    assert result["freed_mib"] >= 2 * 5  # each output's allocation (2 MiB granules) went when the judge let go
