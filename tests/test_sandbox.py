"""The workers' sandbox (`kforge.tools.process.sandbox`), entered by a fresh process as a worker enters it: what code
inside can see and do. The attacks through a real server are in test_sandbox_attacks.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kforge.tools.process.sandbox import Confinement, trial

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux's")


def _inside(home: Path, code: str, *, hidden: tuple[str, ...] = (), pythonpath: str = "",
            max_tasks: int = 0) -> tuple[dict, dict]:
    """Run `code` (which sets `out`, a dict) inside a sandbox for `home` whose own directory is jobs/j1;
    returns (report, out)."""
    conf = Confinement(home=str(home), hidden=hidden, extra_writable=(str(home / "jobs" / "j1"),),
                       max_tasks=max_tasks).as_arg()
    script = f"""
import json, os, sys
from kforge.tools.process.sandbox import Confinement, enter
report = enter(Confinement.from_arg({conf!r}))
out = {{}}
{code}
print(json.dumps([report, out]))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    report, out = json.loads(done.stdout.strip().splitlines()[-1])
    return report, out


def _require(report: dict, *pieces: str) -> None:
    missing = [m for m in report["missing"] if any(p in m for p in pieces)]
    if missing:
        pytest.skip(f"this host refuses part of the sandbox: {missing}")


@pytest.fixture
def home(tmp_path) -> Path:
    home = tmp_path / "home"
    (home / "jobs" / "j1").mkdir(parents=True)
    (home / "jobs" / "j2").mkdir(parents=True)  # another job's
    (home / "jobs" / "j2" / "candidate.py").write_text("another job's code")
    (home / "kforge.db").write_text("the store")
    return home


def test_this_host_gives_the_whole_sandbox(home):
    """CI's VM (root, Linux 6.x, libseccomp) gives every piece; a host that does not says which and why."""
    report = trial(Confinement(home=str(home)))
    assert report["missing"] == [], report["missing"]
    for piece in ("user namespace", "PID namespace", "mount namespace", "IPC namespace", "network namespace",
                  "own /proc", "no capabilities", "no_new_privs", "system-call filter"):
        assert piece in report["applied"]
    assert any(p.startswith("landlock") for p in report["applied"])


def test_the_worker_sees_only_its_processes_and_its_part_of_the_data_directory(home, tmp_path):
    secrets = tmp_path / "secrets"  # on the import path: readable inside, but for the token file, covered
    secrets.mkdir()
    token = secrets / "token"
    token.write_text("s3cret-token")
    (secrets / "other").write_text("visible")
    report, out = _inside(home, f"""
out["procs"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["pid"] = os.getpid()
out["home"] = sorted(os.listdir({str(home)!r}))
out["jobs"] = sorted(os.listdir({str(home / 'jobs')!r}))
try:
    out["other_job"] = open({str(home / 'jobs' / 'j2' / 'candidate.py')!r}).read()
except OSError as exc:
    out["other_job"] = type(exc).__name__
try:
    out["db"] = open({str(home / 'kforge.db')!r}).read()
except OSError as exc:
    out["db"] = type(exc).__name__
out["token"] = open({str(token)!r}).read()
out["other"] = open({str(secrets / 'other')!r}).read()
open({str(home / 'jobs' / 'j1' / 'written')!r}, "w").write("ok")
out["shadow"] = open("/etc/shadow").read() if os.path.exists("/etc/shadow") else ""
""", hidden=(str(token),), pythonpath=str(secrets))
    _require(report, "namespace", "/proc", "mounts", "secrets")
    assert out["pid"] == 1 and out["procs"] == [1]
    assert out["home"] == ["cache", "jobs"] and out["db"] == "FileNotFoundError"
    assert out["jobs"] == ["j1"] and out["other_job"] == "FileNotFoundError"  # other jobs are not there
    assert out["token"] == "" and out["other"] == "visible" and out["shadow"] == ""
    assert (home / "jobs" / "j1" / "written").read_text() == "ok"  # its scratch is the host's


def test_writes_outside_its_directories_and_escapes_are_refused(home):
    import kforge

    package = os.path.dirname(kforge.__file__)
    report, out = _inside(home, f"""
import ctypes, errno
def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
attempt("package", lambda: open(os.path.join({package!r}, "planted.py"), "w"))
attempt("etc", lambda: open("/etc/planted", "w"))
attempt("home", lambda: open(os.path.expanduser("~/planted"), "w"))
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    rc = getattr(libc, name)(*args)
    out[name] = "done" if rc == 0 else errno.errorcode[ctypes.get_errno()]
call("unshare", 0x10000000)
call("setns", 0, 0)
call("ptrace", 16, 1, 0, 0)
call("mount", b"tmpfs", b"/tmp", b"tmpfs", 0, None)
import socket
try:
    socket.create_connection(("127.0.0.1", 22), timeout=2)
    out["tcp"] = "done"
except OSError as exc:
    out["tcp"] = type(exc).__name__
""")
    _require(report, "landlock", "system-call filter", "network")
    # Landlock refuses (EACCES); beneath the private /tmp (a checkout there) the read-only mount does (EROFS).
    assert {out["package"], out["etc"], out["home"]} <= {"EACCES", "EROFS"}, out
    assert out["unshare"] == out["setns"] == out["ptrace"] == out["mount"] == "EPERM", out
    assert out["tcp"] != "done"


def test_tmp_and_dev_shm_are_private_and_bounded(home):
    marker = f"kforge-note-{uuid.uuid4().hex}"
    Path("/tmp", marker + "-host").write_text("host")
    try:
        report, out = _inside(home, f"""
out["sees_host"] = os.path.exists("/tmp/{marker}-host")
for d in ("/tmp", "/dev/shm"):  # memory: bounded (1 GiB each)
    fd = os.open(os.path.join(d, "big"), os.O_CREAT | os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, 2 << 30)
        out[d] = "allocated"
    except OSError as exc:
        out[d] = exc.strerror
    os.close(fd)
    os.unlink(os.path.join(d, "big"))
for d in ("/tmp", "/dev/shm"):
    open(os.path.join(d, "{marker}"), "w").write("note")
""")
        _require(report, "mounts")
        assert out["sees_host"] is False
        assert out["/tmp"] == out["/dev/shm"] == "No space left on device", out
        assert not Path("/tmp", marker).exists() and not Path("/dev/shm", marker).exists()
    finally:
        Path("/tmp", marker + "-host").unlink()


def test_everything_the_worker_started_dies_with_it(home):
    """A detached sleeper (its own session, double-forked) outlives neither the worker nor a kill of its group."""
    tag = f"{time.time() % 1000:.6f}"
    report, _ = _inside(home, f"""
import subprocess
subprocess.Popen(["sleep", "1{tag}"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "2{tag}"])
    os._exit(0)
""")
    _require(report, "PID namespace")

    def sleepers() -> list[str]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if tag in cmd:
                found.append(cmd)
        return found

    deadline = time.monotonic() + 10
    while sleepers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sleepers() == []


def test_the_namespaces_parent_ends_as_the_worker_ends(home):
    """The server knows the outer process: a worker killed by a signal must look killed by it from outside."""
    conf = Confinement(home=str(home)).as_arg()
    for code, expected in (("os._exit(7)", 7), ("os.kill(os.getpid(), 11)", -11)):
        # PID 1 ignores signals it has no handler for when they come from inside: SIGSEGV by the kernel is real
        if "kill" in code:
            code = "import ctypes; ctypes.string_at(0)"
        done = subprocess.run([sys.executable, "-c", f"""
import os
from kforge.tools.process.sandbox import Confinement, enter
enter(Confinement.from_arg({conf!r}))
{code}
"""], capture_output=True, timeout=120)
        assert done.returncode == expected, done.stderr


def test_the_worker_may_name_its_own_threads_and_nothing_else_in_proc(home):
    """The CUDA driver names its threads through /proc/self/task/<tid>/comm (cuInit fails with 304 when it may
    not: H100, 2026-11-24); every other write under /proc stays refused."""
    report, out = _inside(home, """
import threading
def name_me():  # as glibc's pthread_setname_np names another thread
    path = f"/proc/self/task/{threading.get_native_id()}/comm"
    try:
        fd = os.open(path, os.O_RDWR)
        os.write(fd, b"cuda-like")
        os.close(fd)
        out["named"] = open(path).read().strip()
    except OSError as exc:
        out["named"] = str(exc)
t = threading.Thread(target=name_me)
t.start()
t.join()
for path in ("/proc/self/oom_score_adj", "/proc/self/coredump_filter", "/proc/self/comm", "/proc/sys/kernel/core_pattern"):
    try:
        fd = os.open(path, os.O_WRONLY)
        os.close(fd)
        out[path] = "opened for writing"
    except OSError as exc:
        out[path] = exc.strerror
""")
    _require(report, "landlock", "own /proc")
    assert out.pop("named") == "cuda-like"
    assert all(why != "opened for writing" for why in out.values()), out


def test_processes_and_threads_are_capped_per_worker(home):
    """The worker's PID namespace has a pid_max of its own (Linux 6.14+): a fork or a thread beyond it fails,
    and the candidate's failure names the limit; the host's pid_max is untouched."""
    host_limit = Path("/proc/sys/kernel/pid_max").read_text()
    report, out = _inside(home, """
import subprocess, threading, time
from pathlib import Path
from kforge.tools.harness.loader import python_failure
stop = threading.Event()
threads = []
try:
    while len(threads) < 5000:
        t = threading.Thread(target=stop.wait)
        t.start()
        threads.append(t)
except RuntimeError as exc:
    out["failure"] = python_failure(exc, stage="call", user_file=Path("candidate.py")).model_dump(mode="json")
out["threads"] = len(threads)
stop.set()
for t in threads:
    t.join()
out["after"] = subprocess.run(["true"]).returncode  # the room came back with the threads' end
""", max_tasks=512)
    _require(report, "process and thread limit")
    assert "at most 512 processes and threads" in report["applied"]
    assert 400 < out["threads"] < 512, out["threads"]
    assert out["failure"]["kind"] == "resource_limit" and "512 processes and threads" in out["failure"]["message"]
    assert out["after"] == 0
    assert Path("/proc/sys/kernel/pid_max").read_text() == host_limit
