"""Holds on new workers across the KForge processes of one host (`kforge.tools.process.host_holds`): a pool starts no
fork while another server or fleet node agent on the host times or verifies (on 2x H200 the one-host Ray fleet's
trials ran ~3x slower than one server's, whose holds covered both GPUs). The other process here is a `sleep` whose
hold file this test writes, so that its id and start time are a live process's."""

from __future__ import annotations

import os
import subprocess

import anyio
import pytest

from kforge.tools.context import ToolContext
from kforge.tools.process.host_holds import HostHolds, _started

from .test_pool import _idle

pytestmark = pytest.mark.anyio


def _hold_of(proc: subprocess.Popen, directory, state: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / str(proc.pid)).write_text(f"{state} {_started(proc.pid)}")


def test_another_processes_hold_counts_while_that_process_lives(tmp_path):
    here = HostHolds(tmp_path / "holds")
    assert here.others() == (False, False)
    other = subprocess.Popen(["sleep", "60"])
    try:
        _hold_of(other, here.directory, "light")
        assert here.others() == (False, True)
        _hold_of(other, here.directory, "full")
        assert here.others() == (True, False)
        here.publish("full")  # its own hold is not another's
        assert (here.directory / str(os.getpid())).exists() and here.others() == (True, False)
        (here.directory / str(other.pid)).write_text("full 1")  # that id, another start time: not that process
        assert here.others() == (False, False) and not (here.directory / str(other.pid)).exists()
        _hold_of(other, here.directory, "full")
    finally:
        other.kill()
        other.wait()
    assert here.others() == (False, False)  # its process is gone: the file goes too
    assert not (here.directory / str(other.pid)).exists()
    here.close()
    assert list(here.directory.iterdir()) == []


async def test_a_pool_holds_its_refills_while_another_process_of_the_host_times(tmp_path):
    ctx = ToolContext(home=tmp_path / "home")
    holds = HostHolds(tmp_path / "holds")
    other = subprocess.Popen(["sleep", "120"])
    try:
        async with ctx.warm_workers(1) as pool:
            pool.host_holds = holds
            pool.want("cpu")
            with anyio.fail_after(240):
                while _idle(pool) < 1 or pool._under_way:
                    await anyio.sleep(0.1)
            _hold_of(other, holds.directory, "full")  # another server's timing
            await anyio.sleep(0.5)
            taken = pool.take("cpu")
            await anyio.sleep(1.5)
            assert not pool._starting[("cpu", ())] and _idle(pool) == 0  # no refill beside it
            (holds.directory / str(other.pid)).unlink()  # its timing ended
            with anyio.fail_after(120):
                while _idle(pool) < 1:
                    await anyio.sleep(0.1)
            release = pool.hold_forks()  # and this pool's own hold is published for the others
            assert holds.directory.joinpath(str(os.getpid())).read_text().startswith("full ")
            release()
            assert not holds.directory.joinpath(str(os.getpid())).exists()
            assert taken is not None
            await taken.discard()
    finally:
        other.kill()
        other.wait()
