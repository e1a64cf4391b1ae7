"""A forked worker's temporary files go to its own directory (`worker.use_own_directories`). Python reads TMPDIR once and keeps the answer
(`tempfile.tempdir`); a fork inherits the fork server's, whose directory (the data directory's `cache/pool`) is
read-only in every worker: Triton's PTX files for ptxas, written there, failed with "Read-only file system" in every
warm GPU worker (the judge's fused compare, H200, 2026-12-03), and so would a candidate's own temporary file."""

from __future__ import annotations

import pytest

from kforge.server.catalog import problem_reference
from kforge.tools.context import ToolContext
from kforge.tools.evaluate import verify_against_reference
from kforge.tools.requests import VerifyRequest

pytestmark = pytest.mark.anyio

# A ReLU that writes a temporary file first, as Triton does for each kernel it builds.
WRITES_A_TEMP_FILE = '''
import tempfile
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        with tempfile.NamedTemporaryFile(suffix=".ptx") as f:
            f.write(b"// ptx")
            f.flush()
        return torch.clamp_min(x, 0.0)
'''


async def test_a_forked_worker_writes_its_temporary_files_in_its_own_directory(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    async with ctx.warm_workers(1) as pool:
        result = await verify_against_reference(ctx, VerifyRequest(
            backend="cpu", reference_code=problem_reference("relu"), candidate_code=WRITES_A_TEMP_FILE,
            use_store=False))
        assert pool.started >= 1  # the job ran on forked workers, not cold ones
    assert result.correct, str(result)


def test_a_fork_reads_tmpdir_again_where_its_fork_server_had_read_it(tmp_path, monkeypatch):
    import tempfile

    from kforge.tools.harness.worker import use_own_directories

    server_dir = tmp_path / "cache" / "pool"
    server_dir.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(server_dir))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert tempfile.gettempdir() == str(server_dir)  # the fork server's answer, kept (as Triton's driver build has it)
    own = tmp_path / "jobs" / "w-1"
    own.mkdir(parents=True)
    use_own_directories(str(own))
    assert tempfile.gettempdir() == str(own)
