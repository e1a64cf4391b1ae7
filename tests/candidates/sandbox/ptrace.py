"""ATTACK: reach into other processes and the file system tree: PTRACE_SEIZE and process_vm_readv against the
worker's parent, the server and a child of the worker's own (which nothing but the system-call filter
protects), and mount a tmpfs on a directory of the scratch.
MUST: every call fails with EPERM (the system-call filter). A seize is made from a short-lived child, so a
tracee is never stopped and is let go at once; a mount that succeeds is undone at once."""
import ctypes
import errno
import json
import os
import signal

SERVER = __SERVER_PID__
PTRACE_SEIZE, MNT_DETACH = 0x4206, 2
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


libc.process_vm_readv.restype = ctypes.c_ssize_t
libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_ulong, ctypes.POINTER(IoVec),
                                  ctypes.c_ulong, ctypes.c_ulong]


def failed():
    e = ctypes.get_errno()
    return f"blocked: {errno.errorcode.get(e, e)}"


def seize(pid, from_child=True):
    if not from_child:
        return "SUCCEEDED: attached" if libc.ptrace(PTRACE_SEIZE, pid, None, None) == 0 else failed()
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.write(w, seize(pid, from_child=False).encode())
        finally:
            os._exit(0)  # a tracer's exit detaches its tracee
    os.close(w)
    answer = os.read(r, 200).decode() or "the child gave no answer"
    os.close(r)
    os.waitpid(child, 0)
    return answer


def read_memory(pid):
    """8 bytes at the address of None: the same in a process forked from the same interpreter."""
    buf = ctypes.create_string_buffer(8)
    local, remote = IoVec(ctypes.cast(buf, ctypes.c_void_p), 8), IoVec(id(None), 8)
    n = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if n >= 0:
        return f"SUCCEEDED: read {n} bytes"
    if ctypes.get_errno() == errno.EFAULT:
        return "SUCCEEDED: permitted (EFAULT: the address is not mapped there)"
    return failed()


report = {}
for name, pid in (("parent", os.getppid()), ("server", SERVER)):
    report[f"ptrace_{name}"] = seize(pid)
    report[f"vm_read_{name}"] = read_memory(pid)

r, w = os.pipe()
own = os.fork()
if own == 0:
    os.close(w)
    os.read(r, 1)  # waits until the worker closes its end
    os._exit(0)
os.close(r)
try:
    report["ptrace_own_child"] = seize(own, from_child=False)
    report["vm_read_own_child"] = read_memory(own)
finally:
    os.kill(own, signal.SIGKILL)
    os.close(w)
    os.waitpid(own, 0)

target = os.path.abspath("mnt-__MARKER__")
os.mkdir(target)
if libc.mount(b"tmpfs", target.encode(), b"tmpfs", ctypes.c_ulong(0), None) == 0:
    libc.umount2(target.encode(), MNT_DETACH)
    report["mount_tmpfs"] = "SUCCEEDED: mounted (and unmounted again)"
else:
    report["mount_tmpfs"] = failed()
raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps(report))
