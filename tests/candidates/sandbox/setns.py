"""ATTACK: get back onto the server's network: open /proc/<server pid>/ns/net and setns() into it; setns() on
the worker's own namespace (no other process needed); then, in a single-threaded child, unshare(CLONE_NEWUSER)
for a fresh set of capabilities and try setns() again; connect to the server's TCP port at every step.
MUST: every setns and unshare fails and no connection is made (own network namespace; the system-call filter
answers EPERM)."""
import ctypes
import errno
import json
import os
import socket

SERVER = __SERVER_PID__
PORT = __PORT__
CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
libc = ctypes.CDLL(None, use_errno=True)


def failed():
    e = ctypes.get_errno()
    return f"blocked: {errno.errorcode.get(e, e)}"


def connect():
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=3).close()
        return "SUCCEEDED: connected"
    except OSError as exc:
        return f"blocked: {errno.errorcode.get(exc.errno, exc.errno) if exc.errno else type(exc).__name__}"


def join_server():
    try:
        fd = os.open(f"/proc/{SERVER}/ns/net", os.O_RDONLY)
    except OSError as exc:
        return f"blocked: open {errno.errorcode.get(exc.errno, exc.errno)}"
    try:
        return "SUCCEEDED" if libc.setns(fd, CLONE_NEWNET) == 0 else failed()
    finally:
        os.close(fd)


report = {"connect": connect(), "setns_server": join_server(), "connect_after_setns": connect()}
own = os.open("/proc/self/ns/net", os.O_RDONLY)
report["setns_own"] = "SUCCEEDED" if libc.setns(own, CLONE_NEWNET) == 0 else failed()
os.close(own)

r, w = os.pipe()
child = os.fork()
if child == 0:  # unshare(CLONE_NEWUSER) needs a single-threaded process
    try:
        out = {"unshare_user": "SUCCEEDED" if libc.unshare(CLONE_NEWUSER) == 0 else failed()}
        out["setns_server_in_new_userns"] = join_server()
        out["connect_in_new_userns"] = connect()
        os.write(w, json.dumps(out).encode())
    finally:
        os._exit(0)
os.close(w)
answer = b""
while chunk := os.read(r, 4096):
    answer += chunk
os.waitpid(child, 0)
report.update(json.loads(answer) if answer else {"unshare_user": "the child gave no answer"})
raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps(report))
