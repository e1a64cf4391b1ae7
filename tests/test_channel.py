"""The workers' protocol channel (`kforge.tools.process.channel`): descriptors travel with their line, and the server
hands each one on once."""

from __future__ import annotations

import os
import socket

import pytest

from kforge.tools.process.channel import HandedFds, WorkerChannel


def test_a_descriptor_travels_with_its_line_and_is_handed_on_once():
    ours, theirs = socket.socketpair()
    sender, receiver = WorkerChannel(ours), WorkerChannel(theirs)
    fd = os.memfd_create("kforge-test")
    os.write(fd, b"output bytes")
    sender.write({"outputs": [{"kind": "fd", "slot": 0}]}, [fd])
    sender.write({"op": "next"})
    line, fds = receiver.readline()
    assert line.startswith('{"outputs"') and len(fds) == 1
    assert receiver.readline() == ('{"op": "next"}', [])  # the next line carries nothing
    reply = {"outputs": [{"kind": "fd", "slot": 0}], "other": {"kind": "cuda"}}
    handed = HandedFds()
    tokens = handed.take_in(reply, fds)
    plain = {"op": "expect", "i": 1}
    assert handed.hand_out(plain) == (plain, [])
    sent, out = handed.hand_out({"op": "check", "record": reply})
    assert sent["record"]["outputs"] == [{"kind": "fd", "slot": 0}] and reply["outputs"][0]["handle"] == tokens[0]
    assert os.pread(out[0], 12, 0) == b"output bytes"
    with pytest.raises(ValueError, match="handed on already"):
        handed.hand_out({"record": reply})
    handed.discard(tokens)  # nothing left to close
    for f in (fd, *out):
        os.close(f)
    ours.close()
    theirs.close()


@pytest.mark.anyio
async def test_a_read_cancelled_in_the_loop_round_its_bytes_arrive_leaves_no_error_and_the_bytes_for_the_next_read():
    """anyio's socket stream set a cancelled future's result there ("Exception in callback ... InvalidStateError", which
    failed CI as a test's pool shut down, 2026-11-27); the cancel must land in the round after the bytes came, which
    `call_soon` arranges: the loop runs it before it polls the socket again."""
    import asyncio

    import anyio

    from kforge.tools.process.channel import Channel

    ours, peer = socket.socketpair()
    channel = await Channel.from_socket(ours)
    errors: list[dict] = []
    loop = asyncio.get_running_loop()
    handler = loop.get_exception_handler()  # anyio's test runner keeps one loop for many tests: given back below
    loop.set_exception_handler(lambda loop, context: errors.append(context))
    for i in range(10):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(channel.receive_line, 100)
                await anyio.sleep(0.01)
                peer.sendall(f"line {i}\n".encode())
                asyncio.get_running_loop().call_soon(scope.cancel)
                await anyio.sleep(0.01)
        with anyio.fail_after(5):  # the line a cancelled read left is the next read's
            assert (await channel.receive_line(100))[0] == f"line {i}".encode()
    loop.set_exception_handler(handler)
    assert not errors, errors
    await channel.aclose()
    peer.close()
