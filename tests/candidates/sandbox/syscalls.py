"""ATTACK: system calls no kernel needs and that reach past a sandbox: keyctl (the session keyring), bpf (an
array map), io_uring_setup, finit_module, clone(CLONE_NEWUSER) and clone3(CLONE_NEWUSER) (x86_64 numbers).
MUST: each fails with EPERM (clone3: ENOSYS, so that libc falls back to clone, which the filter can read).
Whatever succeeds is closed or ended at once; a cloned child exits immediately."""
import ctypes
import errno
import json
import os
import platform
import signal

# PyDLL keeps the GIL across the call: a child made by a raw clone must find it held by its only thread.
libc = ctypes.PyDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
CLONE_NEWUSER = 0x10000000
NR = {"keyctl": 250, "bpf": 321, "io_uring_setup": 425, "finit_module": 313, "clone": 56, "clone3": 435}


def call(name, *args):
    res = libc.syscall(L(NR[name]), *args)
    if res == -1:
        e = ctypes.get_errno()
        return None, f"blocked: {errno.errorcode.get(e, e)}"
    return res, None


def fd_result(name, *args):
    res, why = call(name, *args)
    if why:
        return why
    os.close(res)
    return f"SUCCEEDED: fd {res}"


def cloned(name, *args):
    res, why = call(name, *args)
    if why:
        return why
    if res == 0:  # the child
        os._exit(0)
    os.waitpid(res, 0)
    return f"SUCCEEDED: child {res} in a new user namespace"


class BpfMap(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("pad", ctypes.c_char * 112)]


class CloneArgs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack",
                                               "stack_size", "tls", "set_tid", "set_tid_size", "cgroup")]


report = {}
if platform.machine() != "x86_64":
    report["arch"] = f"not tried on {platform.machine()}"
else:
    res, why = call("keyctl", L(0), L(-3), L(0))  # KEYCTL_GET_KEYRING_ID of KEY_SPEC_SESSION_KEYRING
    report["keyctl"] = why or f"SUCCEEDED: keyring {res}"
    bpf = BpfMap(2, 4, 4, 1)  # BPF_MAP_TYPE_ARRAY
    report["bpf"] = fd_result("bpf", L(0), ctypes.byref(bpf), L(ctypes.sizeof(bpf)))  # BPF_MAP_CREATE
    params = ctypes.create_string_buffer(120)
    report["io_uring_setup"] = fd_result("io_uring_setup", L(1), params)
    _, why = call("finit_module", L(-1), ctypes.c_char_p(b""), L(0))
    report["finit_module"] = why if why and "EPERM" in why else f"SUCCEEDED: reached the kernel ({why})"
    report["clone_newuser"] = cloned("clone", L(CLONE_NEWUSER | signal.SIGCHLD), L(0), L(0), L(0), L(0))
    args = CloneArgs(flags=CLONE_NEWUSER, exit_signal=signal.SIGCHLD)
    report["clone3_newuser"] = cloned("clone3", ctypes.byref(args), L(ctypes.sizeof(args)))
raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps(report))
