"""The worker's sandbox: what candidate (and reference) code can see and do, set up before any of it runs.

`enter(confinement)` is called by a worker process while it still has one thread (a fork of the zygote, or
a cold worker before it imports torch); it returns in a new process and the caller goes on there:

- **Namespaces** (user, PID, mount, IPC, network): the worker is PID 1 of its own PID namespace, so it sees
  only the processes it started, and when it dies the kernel kills all of them (a `setsid` sleeper too). The
  process that called `enter` stays outside as the namespace's parent: it is what the server knows by pid
  (the session leader it kills), and it mirrors the worker's end as its own.
- **Mounts**: a private tmpfs on `/tmp` and `/dev/shm`, a `/proc` of the namespace, the server's data
  directory covered by an empty tmpfs with only the worker's own directory (its scratch) bound back writable
  and `cache/` read-only (builds are promoted into it by the server, never written by a worker), the token file and the host's password hashes and keys covered by empty files. Other jobs' scratch
  is not there to see; the judge gets the candidate's CPU outputs as descriptors (`kforge.tools.process.channel`).
- **Landlock**: files are read-only except the worker's writable directories; device nodes are only the
  null devices and the device nodes the worker's backend picks (`Backend.device_nodes`: none for the CPU backend
  and builds, only its own GPU's for a worker pinned to one); no TCP; no signals or abstract sockets outside the sandbox (where the kernel's
  Landlock ABI has them).
- **no_new_privs, no capabilities, and a system-call filter** (libseccomp, through pyseccomp): no ptrace,
  no reading other processes' memory, no new namespaces, no mounts, no kernel modules, BPF or io_uring.

Every piece the host refuses is named in the report's `missing` (degrade loudly): results, `kforge doctor`
and the HTTP server's start-up check read it. These are the kernel's own interfaces (the tools that wrap
them, bubblewrap and nsjail, exec a new program, and a worker forked from a warm zygote must not).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

__all__ = ["Confinement", "apply_landlock", "enter", "network_state", "trial", "with_gpu_nodes"]

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x00020000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE, _MS_RELATIME = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18, 1 << 21)
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 1, 24, 38, 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4

# Readable (never writable) system paths: programs, libraries, compilers, CUDA, configuration.
_SYSTEM_READ = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt", "/sys", "/proc")
# A private /tmp or /dev/shm is memory: each holds at most this much (the kernel's default is half the RAM, per
# worker). Candidates' temporary files go to their scratch directory (TMPDIR), on disk.
_TMPFS_BYTES = 1 << 30
_NULL_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# Host files that hold secrets under the readable paths: covered by empty files or directories.
_HOST_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/ssh", "/etc/ssl/private")
# System calls no candidate needs, and that would reach past the sandbox: EPERM.
_DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "setns", "unshare",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "bpf", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl",
    "add_key", "request_key", "swapon", "swapoff", "reboot", "acct", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "syslog", "quotactl", "open_by_handle_at", "name_to_handle_at", "iopl",
    "ioperm", "vhangup", "lookup_dcookie", "nfsservctl", "uselib")


@dataclass(frozen=True)
class Confinement:
    """What a worker may reach. `home`: the server's data directory (only `cache/`, read-only, and `extra_writable`,
    the worker's own directory, writable, stay visible; `extra_readable` paths in it stay visible, read-only); `hidden`: files that must read as empty (the token file); `isolate_network`: False keeps the
    worker on the host's network (operators who set `worker_network = "host"`)."""

    home: str
    hidden: tuple[str, ...] = ()
    isolate_network: bool = True
    extra_writable: tuple[str, ...] = ()
    extra_readable: tuple[str, ...] = ()  # e.g. a CUTLASS checkout that builds include
    max_tasks: int = 0  # processes and threads at once in the worker's PID namespace (0: `default_max_tasks`)
    # The NVIDIA device nodes it may open (`gpu_nodes`): None every one, () none.
    gpu_nodes: tuple[str, ...] | None = None
    # The strict Landlock is applied by the program the sandbox runs, not by the process entering it, which applies
    # only a looser domain of its own (`apply_landlock`, `proc_writable`; `profiled_launch`): under
    # ncu, the profiled worker is a grandchild, and the CUDA driver's start (it names its threads in
    # /proc/self/task/<tid>/comm, error 304 if it may not) needs a rule on that process's own task directory,
    # which only it can make (H100, 2026-11-25).
    landlock_later: bool = False

    def writable(self) -> list[str]:
        """The worker's own directories: the only places it may write (the shared cache is not one, issue 17)."""
        return list(self.extra_writable)

    def shared_read_only(self) -> list[str]:
        """The data directory's shared build caches: readable by every worker, written only by the server, which
        promotes into them what its own sandboxed builds produced (`kforge.tools.process.build_service.serve_build_request`)."""
        return [str(Path(self.home) / "cache")]

    def as_arg(self) -> str:
        import json

        return json.dumps(asdict(self))

    @classmethod
    def from_arg(cls, text: str) -> Confinement:
        import json

        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(text).items()})


def enter(confinement: Confinement) -> dict[str, Any]:
    """Sandbox this (single-threaded) process; returns in the sandboxed worker, with the report:
    {"host_pid": the pid the server knows, "applied": [...], "missing": ["piece: why", ...]}."""
    report: dict[str, Any] = {"host_pid": os.getpid(), "applied": [], "missing": []}
    if sys.platform != "linux":
        report["missing"].append(f"sandbox: {sys.platform} has none of Linux's isolation")
        return report
    _drop_device_descriptors(confinement.gpu_nodes)  # first: in a new mount namespace they no longer read as /dev/...
    libc = ctypes.CDLL(None, use_errno=True)
    for path in (*confinement.writable(), *confinement.shared_read_only()):
        os.makedirs(path, mode=0o700, exist_ok=True)
    in_pid_namespace = _unshare(libc, confinement, report)
    if in_pid_namespace:
        _become_pid_one(libc, report)
    if "mount namespace" in report["applied"]:
        _mounts(libc, confinement, report, new_proc=in_pid_namespace)
    _no_new_privileges(libc, report)
    _drop_capabilities(libc, report)
    if not confinement.landlock_later:
        _landlock(libc, confinement, report)
    _syscall_filter(report)
    return report


def trial(confinement: Confinement) -> dict[str, Any]:
    """Enter the sandbox in a child of this process and return its report (what this host gives a worker)."""
    import json

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # one thread, as a worker's fork
        code = 1
        try:
            os.close(read_end)
            report = enter(confinement)
            os.write(write_end, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        text = answer.read()
    os.waitpid(pid, 0)
    try:
        return json.loads(text)
    except ValueError:
        return {"applied": [], "missing": ["sandbox: the trial child died before it reported"]}


def _unshare(libc: Any, confinement: Confinement, report: dict[str, Any]) -> bool:
    """New namespaces: with a user namespace (any user), else without one (root), else none. Returns
    whether the next child is in a new PID namespace."""
    uid, gid = os.getuid(), os.getgid()
    wanted = _CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWPID | (_CLONE_NEWNET if confinement.isolate_network else 0)
    names = {_CLONE_NEWNS: "mount namespace", _CLONE_NEWIPC: "IPC namespace", _CLONE_NEWPID: "PID namespace",
             _CLONE_NEWNET: "network namespace"}
    why = ""
    for flags in (wanted | _CLONE_NEWUSER, wanted):
        if libc.unshare(flags) == 0:
            if flags & _CLONE_NEWUSER:
                _map_ids(uid, gid, report)
            else:
                report["missing"].append(f"user namespace: {why}")
            report["applied"] += [name for flag, name in names.items() if flags & flag]
            return True
        why = why or os.strerror(ctypes.get_errno())
    report["missing"].append(f"namespaces (user, PID, mount, IPC, network): the OS refused them ({why})")
    return False


def _map_ids(uid: int, gid: int, report: dict[str, Any]) -> None:
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        report["applied"].append("user namespace")
    except OSError as exc:  # the namespace holds; only ownership looks odd inside it
        report["missing"].append(f"user namespace id maps: {exc}")


def _become_pid_one(libc: Any, report: dict[str, Any]) -> None:
    """Fork into the new PID namespace. The parent stays outside and ends as its child ends."""
    pid = os.fork()
    if pid != 0:
        _mirror_child(pid)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # (the server kills both at once, as one group)


def _mirror_child(pid: int) -> None:
    """The namespace's parent: hold nothing of the worker's, wait for it, end the way it ended."""
    os.closerange(0, 65536)  # the worker's channel must see EOF when the worker ends, not when this does
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 1)


def _mount(libc: Any, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source or fstype} on {target}: {os.strerror(err)}")


def _mounts(libc: Any, confinement: Confinement, report: dict[str, Any], *, new_proc: bool) -> None:
    """Private /tmp and /dev/shm, the data directory covered, secrets covered, the namespace's /proc. Paths
    the worker needs that lie under a covered directory are bound back at the same place."""
    try:
        _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here reaches the host's mounts
        private, home = ("/tmp", "/dev/shm"), os.path.realpath(confinement.home)
        writable, readable = _needed_paths(confinement)
        # The shared cache and any readable path of the data directory: bound back read-only once it is covered.
        in_home = [p for p in (os.path.realpath(q) for q in (*confinement.shared_read_only(), *confinement.extra_readable))
                   if _beneath(p, home) and os.path.isdir(p) and p not in writable]
        held = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in (*writable, *in_home)}
        held |= {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in readable
                 if any(_beneath(p, d) for d in private) and p not in held}
        for directory in private:
            if os.path.isdir(directory):
                _mount(libc, "tmpfs", directory, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={_TMPFS_BYTES}")
        # Read-only mounts: Landlock's rule for the private /tmp would otherwise let a worker write what lies
        # beneath it (a checkout or venv in /tmp: the package itself was writable so, CI in /tmp, 2026-11-24).
        _bind_back(libc, {p: fd for p, fd in held.items() if p not in writable and p not in in_home}, read_only=True)
        covered = os.path.isdir(home)  # (not when it lies in the private /tmp: nothing of it is there)
        if covered:  # after the readable paths: one of them may hold it (a venv, the checkout)
            _mount(libc, "tmpfs", home, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")  # mount points only
        # Parents first (the server's header build writes its own directory beneath the read-only cache).
        for path in sorted((*in_home, *writable)):
            _bind_back(libc, {path: held[path]}, read_only=path not in writable)
        if covered:  # the cover itself read-only: nothing is written beside the worker's directories
            _remount_read_only(libc, home)
        report["applied"].append("private /tmp, /dev/shm and data directory")
    except OSError as exc:
        report["missing"].append(f"private mounts: {exc}")
    hidden = [p for p in (*confinement.hidden, *_HOST_SECRETS) if os.path.exists(p)]
    try:
        for path in hidden:
            if os.path.isdir(path):
                _mount(libc, "tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0700,size=4k")
            else:
                _mount(libc, "/dev/null", path, None, _MS_BIND)
        report["applied"].append("secrets covered")
    except OSError as exc:
        report["missing"].append(f"secrets covered: {exc}")
    if new_proc:
        try:
            _mount(libc, "proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
            report["applied"].append("own /proc")
        except OSError as exc:  # some container runtimes mask parts of /proc, which forbids a new one
            report["missing"].append(f"own /proc: {exc}")
            return
        _limit_tasks(confinement.max_tasks or default_max_tasks(), report)


def default_max_tasks() -> int:
    """Processes and threads a worker may have at once: room for a build on every core (a compiler driver,
    its compiler and assembler each) and a thread pool per core, far below a fork bomb's."""
    return max(4096, 32 * (os.cpu_count() or 1))


def _limit_tasks(limit: int, report: dict[str, Any]) -> None:
    """Cap the tasks of the worker's PID namespace: its pid_max, per namespace since Linux 6.14 and writable by
    the namespace's owner (no cgroup delegation needed). A fork or thread start beyond it fails with EAGAIN."""
    try:
        Path("/proc/sys/kernel/pid_max").write_text(str(limit))
        report["applied"].append(f"at most {limit} processes and threads")
    except OSError as exc:  # a kernel before 6.14 has one pid_max, the host's
        report["missing"].append(f"process and thread limit: this kernel has no per-namespace pid_max ({exc.strerror})")


def _bind_back(libc: Any, held: dict[str, int], *, read_only: bool = False) -> None:
    """Bind each held path (an O_PATH descriptor taken before its directory was covered) at its own place."""
    for path, fd in sorted(held.items()):  # parents before what lies beneath them
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            Path(path).touch()
        _mount(libc, f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
        if read_only:
            _remount_read_only(libc, path)
        os.close(fd)


def _remount_read_only(libc: Any, path: str) -> None:
    """Make a bind mount read-only, keeping the flags its source had (a user namespace may not drop them)."""
    kept = os.statvfs(path).f_flag
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
    flags |= kept & (os.ST_NOEXEC | os.ST_NOATIME | os.ST_NODIRATIME)  # the same bits as MS_*
    flags |= _MS_RELATIME if kept & os.ST_RELATIME else 0
    _mount(libc, None, path, None, flags)


def _beneath(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _needed_paths(confinement: Confinement) -> tuple[list[str], list[str]]:
    """The paths the worker writes, and those it reads (minimal: none beneath another)."""
    readable: list[str] = []
    for path in (os.path.realpath(p) for p in (*_readable_paths(), *confinement.extra_readable)):
        if os.path.exists(path) and not any(_beneath(path, k) for k in readable):
            readable = [k for k in readable if not _beneath(k, path)] + [path]
    return [os.path.realpath(p) for p in confinement.writable()], readable


def _readable_paths() -> list[str]:
    """Python (prefixes and every import path), this package, and the backends' toolchains (`toolchain_homes`)."""
    from kforge.backends import toolchain_homes

    here = Path(__file__).resolve().parents[2]
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable), str(here),
             os.path.realpath(sys.executable)]
    paths += [p for p in sys.path if p]
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths += toolchain_homes()
    return paths


# Landlock (uapi/linux/landlock.h): the access rights by ABI version.
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1, 2, 4, 8
_LL_TRUNCATE, _LL_IOCTL_DEV = 1 << 14, 1 << 15
_LL_FILE_RIGHTS = _LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV
_LL_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def apply_landlock(confinement: Confinement, *, proc_writable: bool = False) -> dict[str, Any]:
    """Landlock alone, for the program run in a sandbox entered with `landlock_later` (a worker profiled by ncu),
    called while it is single-threaded, before any user code. Unscoped: ncu's front-end, outside this Landlock
    domain, talks to it through an abstract socket, and signals it; the sandbox's PID and network namespaces
    already hold nothing else to reach. Returns {"applied": [...], "missing": [...]}.

    `proc_writable`: the profiler's own domain (`kforge.tools.process.profiled_launch`, before it execs ncu), which
    ncu, its target and every thread ncu's injection starts there inherit. Its processes' /proc/<pid>/task are not
    known yet, so the namespace's whole /proc is writable in it (the system-call filter still denies ptrace and
    another process's memory); the worker then adds its own stricter domain on its own threads."""
    report: dict[str, Any] = {"applied": [], "missing": []}
    if sys.platform != "linux":
        report["missing"].append(f"landlock: {sys.platform} has none")
        return report
    _landlock(ctypes.CDLL(None, use_errno=True), confinement, report, scoped=False,
              proc_rule="/proc" if proc_writable else "/proc/self/task")
    return report


def _landlock(libc: Any, confinement: Confinement, report: dict[str, Any], *, scoped: bool = True,
              proc_rule: str = "/proc/self/task") -> None:
    abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        report["missing"].append(f"landlock: the kernel does not offer it ({os.strerror(ctypes.get_errno())})")
        return
    fs = _LL_FS_BY_ABI.get(abi, _LL_FS_BY_ABI[5])
    attr = _RulesetAttr(fs, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 and scoped else 0)  # TCP bind+connect; unix+signal
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        report["missing"].append(f"landlock: {os.strerror(ctypes.get_errno())}")
        return
    read = _LL_EXECUTE | _LL_READ_FILE | _LL_READ_DIR
    rules = [(p, read) for p in (*_SYSTEM_READ, *_readable_paths(), *confinement.extra_readable,
                                 *confinement.shared_read_only())]
    devices = _host_device_nodes() if confinement.gpu_nodes is None else list(confinement.gpu_nodes)
    rules += [("/dev", _LL_READ_DIR)] + [(d, _LL_FILE_RIGHTS) for d in (*_NULL_DEVICES, *devices)]
    rules += [(p, fs) for p in ("/tmp", "/dev/shm", *confinement.writable())]
    # The CUDA driver names its threads through /proc/self/task/<tid>/comm during cuInit, which fails (error
    # 304) if it may not (H100, driver 580, 2026-11-24: bench/explore/sandbox_cuda_probe.py). The rule binds to
    # this process's own task directory (its threads only); /proc stays read-only (`apply_landlock`'s
    # `proc_writable` aside).
    rules += [(proc_rule, _LL_WRITE_FILE | _LL_TRUNCATE)]
    try:
        for path, rights in rules:
            _landlock_allow(libc, ruleset, path, rights & fs)
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"restrict_self: {os.strerror(ctypes.get_errno())}")
        report["applied"] += [f"landlock (ABI {abi})", _describe_nodes(devices)]
    except OSError as exc:
        report["missing"].append(f"landlock: {exc}")
    finally:
        os.close(ruleset)


def _landlock_allow(libc: Any, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # not on this host
    try:
        if not os.path.isdir(path):
            rights &= _LL_FILE_RIGHTS
        rule = _PathBeneath(rights, fd)
        if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule),
                        ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"rule for {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def with_gpu_nodes(confinement: Confinement, backend: str | None,
                   env: dict[str, str] | None = None) -> tuple[Confinement, str]:
    """The confinement with its device nodes picked by the worker's backend (`kforge.backends.device_nodes`, from
    `env`, this process's environment by default) where the server left them to the worker, and why every node stays
    open where a pin could not be matched (else ""). Called by the process about to be confined, before its device
    starts: what the backend says the worker must set for its pin to name the same device once only these nodes are
    open (a GPU's UUID for its index) goes into this process's environment, which its children inherit."""
    if confinement.gpu_nodes is not None:
        return confinement, ""
    from kforge.backends import device_nodes

    picked = device_nodes(backend, os.environ if env is None else env)
    os.environ.update(picked.env)
    return replace(confinement, gpu_nodes=picked.nodes), picked.why_all_open


def network_state(report: dict[str, Any], before: str = "host") -> str:
    """The worker's network after `enter`: "isolated", or why not (the namespace's refusal, else `before`)."""
    if "network namespace" in report["applied"] or before == "isolated":
        return "isolated"
    return next((m for m in report["missing"] if "namespace" in m), before)


def _host_device_nodes() -> list[str]:
    from kforge.backends import host_device_nodes

    return host_device_nodes()


def _describe_nodes(nodes: list[str]) -> str:
    """The report's line on the device nodes allowed: "device nodes: nvidia0 + control", "no GPU device nodes". A
    node whose name ends in its number is one device's; the others are shared (a driver's control nodes)."""
    def number(name: str) -> int:
        digits = name[len(name.rstrip("0123456789")):]
        return int(digits) if digits else -1

    names = [os.path.basename(n) for n in nodes]
    devices = sorted((n for n in names if number(n) >= 0), key=lambda n: (n.rstrip("0123456789"), number(n)))
    if not nodes:
        return "no GPU device nodes"
    return f"device nodes: {', '.join(devices) or 'no GPU'}" + (" + control" if len(devices) < len(names) else "")


def _drop_device_descriptors(allowed: tuple[str, ...] | None) -> None:
    """Point descriptors of device nodes (`_host_device_nodes`) the worker may not open at /dev/null: Landlock checks a file when it
    is opened, and a forked worker inherits what its zygote holds (NVML, which torch.cuda.is_available() may start
    there, holds GPUs' nodes open). A library that still uses one gets an error, never another file under its number."""
    if allowed is None:
        return
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return
    host_nodes = _host_device_nodes()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if any(_beneath(target, n) for n in host_nodes) and not any(_beneath(target, a) for a in allowed):
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, fd, inheritable=os.get_inheritable(fd))
            os.close(null)


def _no_new_privileges(libc: Any, report: dict[str, Any]) -> None:
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        report["applied"].append("no_new_privs")
    else:
        report["missing"].append(f"no_new_privs: {os.strerror(ctypes.get_errno())}")


def _drop_capabilities(libc: Any, report: dict[str, Any]) -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets."""
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 40
    for cap in range(last + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # fails only without CAP_SETPCAP: then there is nothing to drop
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        report["missing"].append(f"capabilities dropped: {os.strerror(ctypes.get_errno())}")
        return
    report["applied"].append("no capabilities")


def _syscall_filter(report: dict[str, Any]) -> None:
    try:
        import pyseccomp as seccomp

        rules = seccomp.SyscallFilter(seccomp.ALLOW)
    except (ImportError, OSError, RuntimeError) as exc:  # no libseccomp on this host
        report["missing"].append(f"system-call filter: libseccomp is not usable here ({exc})")
        return
    try:
        for name in _DENIED_SYSCALLS:
            try:
                rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
            except (ValueError, RuntimeError, OSError):
                pass  # not a system call on this architecture
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # its flags are out of a filter's reach: libc falls back to clone
        for flag in (_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET, 0x02000000,
                     0x04000000, 0x00000080):  # + cgroup, uts, time
            rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        rules.load()
        report["applied"].append("system-call filter")
    except (ValueError, RuntimeError, OSError) as exc:
        report["missing"].append(f"system-call filter: {exc}")


def main(argv: list[str]) -> None:
    """`python -m kforge.tools.process.sandbox CONFINEMENT -- COMMAND...`: run COMMAND in a sandbox of its own (the
    server's detached header builds, which must not live in a worker's PID namespace)."""
    split = argv.index("--")
    enter(Confinement.from_arg(argv[split - 1]))
    os.execvp(argv[split + 1], argv[split + 1:])


if __name__ == "__main__":
    main(sys.argv[1:])
