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
