"""The worker side of the fork server: `python -m kforge.tools.harness.worker --zygote <backend>`.

Starting a worker costs an interpreter, `import torch` and the compilers' identities: 3-5 s on a
GPU host, seconds more on a small busy machine, and a stream of candidates pays it several times per
candidate. A *zygote* pays it once: it imports all of that but never touches the device (CUDA does
not survive a fork), then forks one worker per request in ~20 ms. The forked worker applies its
kind's environment, starts the device (~0.2 s), and from then on is an ordinary worker serving one
job: candidates still never share a process.

Control channel (a Unix stream socket on the zygote's fd 0):
  server -> zygote: one byte carrying one file descriptor (SCM_RIGHTS): the new worker's protocol
                    socket; the zygote reads one byte at a time, so each byte owns exactly its fd;
  zygote -> server: JSON lines: {"ready": true} (or false, and why) once, then {"forked": pid} per request, in
                    the order of the requests (the server can pause a worker still readying its device), and
                    {"exited": pid, "code": c} per worker (c as subprocess reports it: negative for a signal),
                    because only the zygote, the workers' parent, can learn how a worker ended.
The server closing the channel ends the zygote, which kills the workers it still has.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import sys
from typing import Any, Callable

__all__ = ["serve_forks"]


def _send_line(sock: socket.socket, payload: dict[str, Any]) -> None:
    sock.sendall((json.dumps(payload) + "\n").encode())


def serve_forks(ctl_fd: int, preload: Callable[[], Any], run_child: Callable[[socket.socket], None]) -> None:
    """Preload, say ready on `ctl_fd` (with what `preload` returned: its phases' seconds), then fork
    `run_child(protocol_socket)` per request until EOF."""
    ctl = socket.socket(fileno=ctl_fd)
    try:
        phases = preload()
    except BaseException as exc:  # noqa: BLE001 - the pool falls back to cold workers, which report the problem
        _send_line(ctl, {"ready": False, "why": f"{type(exc).__name__}: {exc}"[:500]})
        return
    # What the preload made (torch, the backend's libraries) lives as long as the zygote: out of the collector's
    # sight, a worker's full collection (a kept judge's reset) scans only what it made itself (Python's gc.freeze
    # docs: before a fork), and its pages stay shared with the zygote.
    gc.freeze()
    _send_line(ctl, {"ready": True, "phases": phases if isinstance(phases, dict) else {}})
    children: set[int] = set()
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ)
    try:
        while True:
            readable = sel.select(timeout=0.05)
            _reap(ctl, children)
            if not readable:
                continue
            data, fds, _, _ = socket.recv_fds(ctl, 1, 1)
            if not data:
                return  # the server is gone
            for fd in fds:
                pid = os.fork()
                if pid == 0:  # the worker: never returns into this loop
                    code = 1
                    try:
                        sel.close()
                        ctl.close()  # candidate code must not reach the zygote
                        os.setsid()  # its own process group: the server kills it with its compilers
                        run_child(socket.socket(fileno=fd))
                        code = 0
                    finally:
                        os._exit(code)
                os.close(fd)
                children.add(pid)
                _send_line(ctl, {"forked": pid})
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _reap(ctl: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        try:
            _send_line(ctl, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
        except OSError:
            return


if sys.platform == "win32":  # pragma: no cover - fork and SCM_RIGHTS are POSIX
    raise ImportError("the fork server needs a POSIX system")
