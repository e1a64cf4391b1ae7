"""A worker's protocol channel: JSON lines over a UNIX socket, with file descriptors passed beside them.

Every worker, warm or cold, talks to the server over one socket (fd 0 of a cold worker, the zygote's fork
for a warm one). Descriptors travel with a line (SCM_RIGHTS, sent with its first byte), so a candidate's CPU
outputs reach the judge as memory file descriptors, through the server, and no directory is shared between
the two workers of a job or between jobs (issue 17: a warm worker's sandbox is made before its job).

Server side, a received descriptor is registered under a token (`HandedFds`); a payload naming the token is
sent with the descriptor itself, which the server then closes: each descriptor is handed on once.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import socket
from collections import deque
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, SocketAttribute, UNIXSocketStream
from anyio.lowlevel import checkpoint
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = ["Channel", "HandedFds", "SocketBytes", "WorkerChannel", "FD_KIND", "close_socket_stream", "raw_socket"]

FD_KIND = "fd"  # an output descriptor's kind when its bytes are in a passed file descriptor
_MAX_FDS_PER_MESSAGE = 250  # the kernel's SCM_MAX_FD is 253


class WorkerChannel:
    """The worker's end (blocking): `readline` returns a line and the descriptors that came with it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = b""
        self._fds: list[int] = []

    def readline(self) -> tuple[str, list[int]] | None:
        """The next line and its descriptors (the server sends one request at a time), None at EOF."""
        while b"\n" not in self._buf:
            data, fds, _, _ = socket.recv_fds(self.sock, 1 << 20, _MAX_FDS_PER_MESSAGE)
            self._fds += fds
            if not data:
                return None
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        fds, self._fds = self._fds, []
        return line.decode(), fds

    def write(self, payload: dict[str, Any], fds: list[int] | None = None) -> None:
        data = (json.dumps(payload) + "\n").encode()
        if fds:  # descriptors ride on the first byte; the rest follows as plain data
            socket.send_fds(self.sock, [data[:1]], fds)
            data = data[1:]
        self.sock.sendall(data)


class SocketBytes(ByteReceiveStream):
    """A socket's bytes, keeping the descriptors that arrive with them (closed at once where nobody keeps them).

    It waits with `anyio.wait_readable`, not through anyio's socket stream: that stream's receive sets a future's
    result from the event loop's reader callback, and where a cancellation reached the waiting task in the same loop
    round as the bytes, asyncio reported "Exception in callback ... InvalidStateError" (anyio 4.16 on Python 3.11;
    CI's test_build_cache failed on it as a test's pool shut down, 2026-11-27). `wait_readable` allows for that."""

    def __init__(self, sock: socket.socket, received: deque[int] | None = None) -> None:
        self._sock, self._received = sock, received

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await checkpoint()
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, max_bytes, _MAX_FDS_PER_MESSAGE)
            except BlockingIOError:
                await anyio.wait_readable(self._sock)
                continue
            except OSError as exc:
                raise (anyio.ClosedResourceError() if self._sock.fileno() < 0 else anyio.BrokenResourceError()) from exc
            break
        if self._received is not None:
            self._received.extend(fds)
        else:
            for fd in fds:
                _close(fd)
        if not data:
            raise anyio.EndOfStream
        return data

    async def aclose(self) -> None:
        await close_socket_stream(self._sock, None)


def raw_socket(stream: UNIXSocketStream) -> socket.socket:
    return stream.extra(SocketAttribute.raw_socket)


async def close_socket_stream(sock: socket.socket, stream: UNIXSocketStream | None) -> None:
    """Close a socket that `SocketBytes` may be waiting on: the wait ends (ClosedResourceError) before the close."""
    if sock.fileno() >= 0:
        anyio.notify_closing(sock)
    if stream is not None:
        await stream.aclose()
    else:
        sock.close()


class Channel:
    """The server's end of a worker's socket."""

    def __init__(self, stream: UNIXSocketStream) -> None:
        self.stream = stream  # sends go through the stream, receives through `SocketBytes` on its socket
        self._received: deque[int] = deque()
        self.lines = BufferedByteReceiveStream(SocketBytes(raw_socket(stream), self._received))

    @classmethod
    async def from_socket(cls, sock: socket.socket) -> Channel:
        return cls(await UNIXSocketStream.from_socket(sock))

    async def send(self, data: bytes, fds: list[int] | None = None) -> None:
        if fds:
            await self.stream.send_fds(data[:1], fds)
            data = data[1:]
        await self.stream.send(data)

    async def receive_line(self, limit: int) -> tuple[bytes, list[int]]:
        line = await self.lines.receive_until(b"\n", limit)
        fds = list(self._received)
        self._received.clear()
        return line, fds

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        for fd in self._received:
            _close(fd)
        self._received.clear()
        await close_socket_stream(raw_socket(self.stream), self.stream)


class HandedFds:
    """Descriptors a worker sent, held by the server until a payload hands them to another worker."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def take_in(self, reply: Any, fds: list[int]) -> list[str]:
        """Replace each `{"kind": "fd", "slot": i}` of a reply by a token for the i-th descriptor received;
        returns the tokens (`discard` them when their worker ends)."""
        tokens = [secrets.token_hex(8) for _ in fds]
        self._held.update(zip(tokens, fds))
        for d in _fd_descriptors(reply):
            slot = d.pop("slot", None)
            if isinstance(slot, int) and 0 <= slot < len(tokens):
                d["handle"] = tokens[slot]
        return tokens

    def hand_out(self, payload: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        """The payload as sent and the descriptors it names, in slot order (close them once sent). A payload that
        names none goes as it is; one that does is copied (its caller may send the same record again)."""
        if not _fd_descriptors(payload):
            return payload, []
        sent, out = copy.deepcopy(payload), []
        for d in _fd_descriptors(sent):
            fd = self._held.pop(d.pop("handle", ""), None)
            if fd is None:
                raise ValueError("an output's descriptor was handed on already, or never received")
            d["slot"] = len(out)
            out.append(fd)
        return sent, out

    def discard(self, tokens: list[str]) -> None:
        """Close what of these was never handed on."""
        for token in tokens:
            if (fd := self._held.pop(token, None)) is not None:
                _close(fd)


def _fd_descriptors(obj: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("kind") == FD_KIND:
                found.append(item)
            else:
                stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def close_all(fds: list[int]) -> None:
    for fd in fds:
        _close(fd)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
