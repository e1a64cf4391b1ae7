"""The warm pool on a GPU host: a worker of the cpu backend holds no device context (it used to start CUDA
through torch's profiler and torch.cuda.is_available(): 1.15 GB of device memory each), while a cuda one does.
Skipped without a GPU; run by scripts/run_gpu_tests.sh."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest

from kforge.tools.context import ToolContext

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


def _tree(pid: int) -> set[int]:
    """The pid and its descendants (a sandboxed worker runs as the child of the pid the server knows)."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            todo += [int(c) for c in task.read_text().split()]
    return found


def _gpu_pids() -> set[int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True).stdout
    return {int(line) for line in out.split() if line.strip().isdigit()}


async def test_a_cpu_worker_holds_no_device_context_and_a_cuda_one_does(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        with anyio.fail_after(240):
            while not (pool._idle.get(("cpu", ())) and pool._idle.get(("cuda", ()))):
                await anyio.sleep(0.2)
        on_gpu = _gpu_pids()
        cpu_worker, cuda_worker = pool._idle[("cpu", ())][0], pool._idle[("cuda", ())][0]
        assert _tree(cuda_worker.proc.pid) & on_gpu, f"the cuda worker shows no context: {on_gpu}"
        assert not _tree(cpu_worker.proc.pid) & on_gpu, "a cpu worker started a CUDA context"
