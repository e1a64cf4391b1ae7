"""Attacks on the worker sandbox (issue 17), each made by a candidate through a real MCP client against
`kforge serve`: over HTTPS (a token file, a TLS key, an API key in the server's environment) and, for two of
them, stdio. One shared HTTP server serves most attacks; the signal attack gets servers of its own.

Every candidate (tests/candidates/sandbox/) makes its probe at import time and raises
`RuntimeError("SANDBOX-REPORT <marker> {json}")`, so the tool answers with a failure whose message carries
the report; each probe in it says "blocked: ..." / "absent" / "empty" or "SUCCEEDED: ...". The tests
assert the attack was blocked, and, where an attack would leave traces on the host (processes, files,
a dead server), look for them there.

Where `kforge doctor` says the host refused a piece of the sandbox (`worker_sandbox.missing`), the
attacks that piece would explain are skipped with the refusal in the reason; nothing else is excused.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import pytest

import kforge

from .conftest import HttpServer, kforge_command, server_env, stdio_session
from .test_e2e_remote import _alive, _source, _unique

pytestmark = pytest.mark.anyio

TOKEN = secrets.token_urlsafe(32)
API_KEY = "sk-ant-test-" + secrets.token_hex(8)
_TAG = "SANDBOX-REPORT"

# The pieces of `worker_sandbox.missing` (matched in the text before its first colon, lower case) whose
# absence would let each attack through: then the attack is skipped, saying so.
_EXPLAINS = {
    "procview": ("sandbox", "pid", "/proc"),
    "store": ("sandbox", "mount"),
    "token": ("sandbox", "mount", "secrets"),
    "setns": ("sandbox", "network", "pid", "system-call"),
    "signals": ("sandbox", "pid"),
    "leftovers": ("sandbox", "pid"),
    "notes": ("sandbox", "mount"),
    "data_notes": ("sandbox", "mount", "landlock"),
    "writes": ("sandbox", "mount", "landlock", "capabilities", "no_new_privs"),
    "jobs": ("sandbox", "landlock", "capabilities", "no_new_privs"),
    "ptrace": ("sandbox", "system-call", "no_new_privs"),
    "syscalls": ("sandbox", "system-call", "no_new_privs"),
    "shadow": ("sandbox", "mount", "secrets"),
}


# -- the server, and what doctor says about the sandbox ---------------------------------------------
@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory) -> Path:
    """The operator's bearer token and TLS key (and certificate), outside the data directory and *readable*
    inside the sandbox were they not masked: beside these candidates in the package directory, which workers
    may read (files under /tmp would be hidden by the private /tmp anyway and prove nothing about the mask).
    Removed afterwards."""
    where = Path(__file__).parent / "candidates" / "sandbox" / f".test-secrets-{secrets.token_hex(4)}"
    try:
        where.mkdir(mode=0o700)
    except OSError:  # a read-only checkout
        where = tmp_path_factory.mktemp("operator")
    try:
        (where / "token").write_text(TOKEN + "\n")
        (where / "token").chmod(0o600)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(where / "key.pem"),
                        "-out", str(where / "cert.pem")], check=True, capture_output=True)
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _http_server(home: Path, secrets_dir: Path) -> HttpServer:
    server = HttpServer(home, "--token-file", str(secrets_dir / "token"), "--certfile", str(secrets_dir / "cert.pem"),
                        "--keyfile", str(secrets_dir / "key.pem"), ca=secrets_dir / "cert.pem", ANTHROPIC_API_KEY=API_KEY,
                        # A host that refuses a piece still serves: the attacks that piece explains are skipped
                        # (`_require`), the others still run. (The variable, not the flag: older servers ignore it.)
                        KFORGE_ALLOW_PARTIAL_SANDBOX="1")
    server.token = TOKEN  # for the client; the server read it from the file
    server.home = home  # type: ignore[attr-defined]
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory, secrets_dir):
    server = _http_server(tmp_path_factory.mktemp("sandbox-home"), secrets_dir)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sandbox(server) -> dict[str, Any] | None:
    """`worker_sandbox` from `kforge doctor --json --no-measure` on the server's data directory (None: not reported)."""
    doctor = subprocess.run([*kforge_command(), "doctor", "--json", "--no-measure"], env=server_env(server.home),
                            capture_output=True, text=True, timeout=300)
    try:
        found = json.loads(doctor.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"kforge doctor --json printed no JSON (exit {doctor.returncode}): {doctor.stderr[-2000:]}")
    return found.get("worker_sandbox", found.get("worker_isolation"))


# Where the notes attack leaves and looks for its note (a Python expression in the candidate).
_PRIVATE_DIRS = '("/dev/shm", "/tmp")'


def _require(sandbox: dict[str, Any] | None, attack: str) -> None:
    refused = [m for m in (sandbox or {}).get("missing") or []
               if any(k in m.split(":", 1)[0].lower() for k in _EXPLAINS[attack])]
    if refused:
        pytest.skip(f"the host refused part of the worker sandbox, which would let the {attack} attack through: "
                    + "; ".join(refused))


def _doctor_says(sandbox: dict[str, Any] | None) -> str:
    return f"doctor's worker_sandbox: {sandbox}" if sandbox else "doctor reports no worker_sandbox (none in place?)"


# -- running an attack --------------------------------------------------------------------------------
class Report(dict):
    """The candidate's report; `raw` is everything the tool answered, `marker` the call's marker."""
    raw: str = ""
    marker: str = ""


async def _attack(client, name: str, *, tool: str = "compile_kernel", marker: str = "", **subs: str) -> Report:
    marker = marker or secrets.token_hex(6)
    code = _unique(_source(f"sandbox/{name}", MARKER=marker, **subs))
    args: dict[str, Any] = {"backend": "cpu", "candidate_code": code, "wait_s": 300}
    if tool == "verify_against_reference":
        args.update(problem="relu", trials=1)
    result = await client.call_tool(tool, args)
    raw = result.content[0].text if result.content else ""
    assert not result.is_error, f"{name}: the tool call failed: {raw}"
    raw += json.dumps(result.structured_content)
    message = ((result.structured_content or {}).get("failure") or {}).get("message") or ""
    tag = f"{_TAG} {marker} "
    assert tag in message, f"{name}: no report from the candidate (killed before it raised?): {result.structured_content}"
    report = Report(json.JSONDecoder().raw_decode(message.split(tag, 1)[1])[0])
    report.raw, report.marker = raw, marker
    print(f"{name}: {dict(report)}")  # shown with -rP / -s: what each probe met
    return report


def _blocked(value: str) -> bool:
    return value in ("absent", "empty") or value.startswith(("blocked", "not tried"))


def _assert_blocked(report: Report, keys, sandbox, *, exactly: str | None = None) -> None:
    through = {k: report[k] for k in keys if not _blocked(report[k]) or (exactly and report[k] != f"blocked: {exactly}")}
    assert not through, f"not blocked{f' with {exactly}' if exactly else ''}: {through}; full report {dict(report)}; " \
                        f"{_doctor_says(sandbox)}"


# -- the host's view of processes ---------------------------------------------------------------------
def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _stdio_server_pid(home: Path) -> int:
    """The `kforge serve` this test process started over stdio for `home`."""
    for pid in _pids():
        if _parent(pid) == os.getpid() and "serve" in _cmdline(pid).split():
            try:
                if f"KFORGE_HOME={home}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    return pid
            except OSError:
                continue
    raise AssertionError(f"no stdio `kforge serve` child for {home}")


def _zygote_pid(server_pid: int, wait_s: float = 60) -> int:
    """The server's zygote (0 if it has none within `wait_s`)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for pid in _pids():
            if _parent(pid) == server_pid and "--zygote" in _cmdline(pid).split():
                return pid
        time.sleep(0.2)
    return 0


@asynccontextmanager
async def _client(transport: str, server: HttpServer, home: Path) -> AsyncIterator[tuple[Any, int]]:
    """A client of the shared HTTP server, or of a stdio server of its own on `home`, and the server's pid."""
    if transport == "http":
        async with server.session() as client:
            yield client, server.proc.pid
    else:
        async with stdio_session(home) as client:
            yield client, _stdio_server_pid(home)


# -- 1. the process view --------------------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_a_worker_sees_no_server_zygote_judge_or_other_process(transport, server, sandbox, tmp_path):
    """verify_against_reference, so that the judge's worker runs beside the candidate's."""
    _require(sandbox, "procview")
    async with _client(transport, server, tmp_path) as (client, pid):
        report = await _attack(client, "procview", tool="verify_against_reference", SERVER_PID=str(pid))
    seen = {k: report[k] for k in ("flagged", "server_visible", "others", "procs")}
    assert not report["flagged"] and not report["server_visible"] and report["others"] == 0, \
        f"the worker sees processes beyond its own: {seen}; {_doctor_says(sandbox)}"
    _assert_blocked(report, ("environ", "mem", "fd"), sandbox)


# -- 2. the result store --------------------------------------------------------------------------------
async def test_the_result_store_cannot_be_opened(server, sandbox):
    _require(sandbox, "store")
    assert (server.home / "kforge.db").is_file()  # there is something to find
    async with server.session() as client:
        report = await _attack(client, "store", HOME=str(server.home))
    opened = {f"{db}.{op}": how for db, ops in report.items() if db.startswith("db")
              for op, how in ops.items() if not _blocked(how)}
    assert not opened, f"kforge.db reached from a worker: {opened}; found {report['found']} from cwd {report['cwd']}; " \
                       f"{_doctor_says(sandbox)}"


# -- 3. the token file (and the TLS key) -----------------------------------------------------------------
async def test_the_token_file_and_tls_key_read_empty_or_not_at_all(server, sandbox, secrets_dir):
    _require(sandbox, "token")
    async with server.session() as client:
        report = await _attack(client, "token", TOKEN_FILE=str(secrets_dir / "token"), KEY_FILE=str(secrets_dir / "key.pem"))
    assert TOKEN not in report.raw
    _assert_blocked(report, ("token", "tls_key"), sandbox)


# -- 4. setns / unshare back onto the network -----------------------------------------------------------
async def test_setns_and_unshare_lead_nowhere(server, sandbox):
    _require(sandbox, "setns")
    async with server.session() as client:
        report = await _attack(client, "setns", SERVER_PID=str(server.proc.pid), PORT=str(server.port))
    _assert_blocked(report, ("connect", "setns_server", "connect_after_setns", "setns_own", "unshare_user",
                             "setns_server_in_new_userns", "connect_in_new_userns"), sandbox)


# -- 5. signals to the server ---------------------------------------------------------------------------
async def _signals(client, server_pid: int, candidate) -> tuple[int, Report | None, str]:
    warm = await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": _unique(candidate("relu_python")),
                                                     "wait_s": 300})
    assert not warm.is_error and warm.structured_content["ok"], warm.content[0].text  # the zygote is up
    zygote = await anyio.to_thread.run_sync(_zygote_pid, server_pid, 30)
    assert zygote, f"server {server_pid} has no zygote to aim at"
    try:
        with anyio.fail_after(120):
            return zygote, await _attack(client, "signals", SERVER_PID=str(server_pid), ZYGOTE_PID=str(zygote)), ""
    except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - the server went away during the call
        return zygote, None, f"the call failed: {exc!r}"


async def _verifies(client, candidate) -> str:
    """'' if the server still verifies an honest candidate, else what went wrong."""
    try:
        with anyio.fail_after(300):
            result = await client.call_tool("verify_against_reference", {
                "backend": "cpu", "problem": "relu", "candidate_code": _unique(candidate("relu_python")), "trials": 2,
                "wait_s": 300})
    except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001
        return f"the next call failed: {exc!r}"
    ok = not result.is_error and (result.structured_content or {}).get("correct") is True
    return "" if ok else f"the next call did not verify: {result.content[0].text[:500]}"


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_signals_do_not_reach_the_server_or_its_zygote(transport, sandbox, secrets_dir, tmp_path, candidate):
    """A server of its own: before the sandbox this attack kills it."""
    _require(sandbox, "signals")
    if transport == "http":
        own = _http_server(tmp_path, secrets_dir)
        try:
            async with own.session() as client:
                zygote, report, error = await _signals(client, own.proc.pid, candidate)
            server_alive, zygote_alive = _alive(own.proc.pid), not zygote or _alive(zygote)
            if server_alive:
                async with own.session() as client:
                    after = await _verifies(client, candidate)
            else:
                after = "the server is dead"
        finally:
            own.stop()
    else:
        async with stdio_session(tmp_path) as client:
            pid = _stdio_server_pid(tmp_path)
            zygote, report, error = await _signals(client, pid, candidate)
            server_alive, zygote_alive = _alive(pid), not zygote or _alive(zygote)
            after = await _verifies(client, candidate) if server_alive else "the server is dead"
    state = f"server alive: {server_alive}, zygote {zygote} alive: {zygote_alive}, {error or 'report: ' + str(report)}"
    assert server_alive and zygote_alive and not after, f"{state}; {after}; {_doctor_says(sandbox)}"
    assert report is not None, state
    _assert_blocked(report, ("parent", "zygote", "server"), sandbox)


# -- 6. processes left behind -----------------------------------------------------------------------------
def _sleepers(arg: str) -> list[int]:
    found = []
    for pid in _pids():
        if _cmdline(pid) == f"sleep {arg}":
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(pid)
            except (OSError, IndexError):
                pass
    return found


async def test_detached_sleepers_do_not_outlive_the_job(server, sandbox):
    _require(sandbox, "leftovers")
    arg = f"{900 + secrets.randbelow(99)}.{secrets.randbelow(10**6):06d}"
    async with server.session() as client:
        report = await _attack(client, "leftovers", SLEEP=arg)
    deadline = time.monotonic() + 10
    while (left := _sleepers(arg)) and time.monotonic() < deadline:
        await anyio.sleep(0.2)
    for pid in left:  # this test's candidate started them
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"{len(left)} sleepers outlived their job by 10 s: {dict(report)}; {_doctor_says(sandbox)}"


# -- 7. notes between jobs in /dev/shm and /tmp ---------------------------------------------------------------
async def test_notes_in_tmp_and_shm_do_not_pass_between_jobs(server, sandbox):
    _require(sandbox, "notes")
    note = secrets.token_hex(8)
    paths = [Path("/dev/shm") / f"kforge-note-{note}", Path("/tmp") / f"kforge-note-{note}"]
    try:
        async with server.session() as client:
            wrote = await _attack(client, "notes", NOTE=note, MODE="write", DIRS=_PRIVATE_DIRS)
            read = await _attack(client, "notes", NOTE=note, MODE="read", DIRS=_PRIVATE_DIRS)
        on_host = [str(p) for p in paths if p.exists()]
    finally:
        for p in paths:
            p.unlink(missing_ok=True)
    assert not on_host, f"job A's notes are on the host: {on_host} (job A: {dict(wrote)}); {_doctor_says(sandbox)}"
    _assert_blocked(read, ("/dev/shm", "/tmp"), sandbox)


def _notes_between_jobs(server, note: str) -> tuple[list[str], list[Path]]:
    """The directories of the data directory two jobs have in common, as the notes candidate names them."""
    dirs = [server.home, server.home / "jobs", server.home / "cache", server.home / "cache" / "builds"]
    return [str(d) for d in dirs], [d / f"kforge-note-{note}" for d in dirs]


async def _pass_a_note(server, dirs: list[str], note: str) -> tuple[Report, Report]:
    async with server.session() as client:
        wrote = await _attack(client, "notes", NOTE=note, MODE="write", DIRS=json.dumps(dirs))
        read = await _attack(client, "notes", NOTE=note, MODE="read", DIRS=json.dumps(dirs))
    return wrote, read


async def test_no_note_passes_between_jobs_through_the_data_directory(server, sandbox):
    """A worker sees of the data directory only its own directory (and the cache, read-only): a note left in the data
    directory or in jobs/ lands nowhere (read-only), and the next job finds none."""
    _require(sandbox, "data_notes")
    note = secrets.token_hex(8)
    dirs, paths = _notes_between_jobs(server, note)
    try:
        wrote, read = await _pass_a_note(server, dirs[:2], note)
    finally:
        left = [str(p) for p in paths if p.exists()]
        for p in paths:
            p.unlink(missing_ok=True)
    assert not left, f"job A's notes are on the host: {left} (job A: {dict(wrote)}); {_doctor_says(sandbox)}"
    _assert_blocked(wrote, dirs[:2], sandbox)
    _assert_blocked(read, dirs[:2], sandbox)


async def test_no_note_passes_between_jobs_through_the_build_cache(server, sandbox):
    """cache/ is read-only to workers (the server promotes builds into it): a note left there lands nowhere."""
    _require(sandbox, "data_notes")
    note = secrets.token_hex(8)
    dirs, paths = _notes_between_jobs(server, note)
    try:
        _, read = await _pass_a_note(server, dirs[2:], note)
    finally:
        for p in paths:
            p.unlink(missing_ok=True)
    _assert_blocked(read, dirs[2:], sandbox)


# -- 8. writes outside the worker's directories ----------------------------------------------------------------
async def test_writes_outside_the_scratch_fail(server, sandbox):
    _require(sandbox, "writes")
    user_home = Path(os.environ["HOME"]).resolve()
    package = Path(kforge.__file__).resolve().parent
    dirs = [server.home, package, package / "resources", package / "resources" / "problems", user_home]
    marker = secrets.token_hex(6)
    try:
        async with server.session() as client:
            report = await _attack(client, "writes", marker=marker, HOME=str(server.home), USER_HOME=str(user_home))
    finally:
        mine = [p for d in dirs for p in d.glob(f"kforge-write-{marker}-*")]
        for p in mine:
            p.unlink(missing_ok=True)
    assert not mine, f"files written by a candidate reached the host: {mine}; {_doctor_says(sandbox)}"
    # A create in the data directory may land in a private tmpfs that covers it (checked on the host above);
    # so may one in a HOME under /tmp. Everywhere else the create itself must fail.
    private = ("/tmp/", "/dev/shm/")
    keys = ["package", "resources", "problems", "append_package", "append_problem"]
    keys += [] if str(user_home).startswith(private) else ["user_home"]
    _assert_blocked(report, keys, sandbox)


async def test_a_worker_cannot_write_beside_its_own_job(server, sandbox, candidate):
    """jobs/ holds every job's scratch; a worker may write only in its own, and sees no other: another job runs
    meanwhile, and the attacker finds neither its directory nor its files."""
    _require(sandbox, "jobs")
    marker = secrets.token_hex(6)
    jobs = server.home / "jobs"
    try:
        async with server.session() as client:
            other = await client.call_tool("compile_kernel", {"backend": "cpu", "wait_s": 0,
                                                              "candidate_code": _unique(candidate("slow_import"))})
            try:
                report = await _attack(client, "jobs", marker=marker)
            finally:
                if job_id := (other.structured_content or {}).get("job_id"):
                    await client.call_tool("cancel_job", {"job_id": job_id})
    finally:
        mine = list(jobs.glob(f"kforge-write-{marker}-*"))
        for p in mine:
            if p.is_dir():
                p.rmdir()
            else:
                p.unlink()
    assert not mine, f"a candidate wrote into jobs/ on the host: {mine}; {dict(report)}; {_doctor_says(sandbox)}"
    _assert_blocked(report, ("file_in_jobs", "planted_job"), sandbox)
    assert report["other_jobs_seen"] == 0 and report["their_files_read"] == [], dict(report)


# -- 9. ptrace, process_vm_readv, mount; the other denied system calls -------------------------------------------
async def test_ptrace_process_memory_and_mount_get_eperm(server, sandbox):
    _require(sandbox, "ptrace")
    async with server.session() as client:
        report = await _attack(client, "ptrace", SERVER_PID=str(server.proc.pid))
    _assert_blocked(report, ("ptrace_parent", "vm_read_parent", "ptrace_server", "vm_read_server", "ptrace_own_child",
                             "vm_read_own_child", "mount_tmpfs"), sandbox, exactly="EPERM")


async def test_keyctl_bpf_io_uring_modules_and_new_namespaces_are_denied(server, sandbox):
    _require(sandbox, "syscalls")
    async with server.session() as client:
        report = await _attack(client, "syscalls")
    if "arch" in report:
        pytest.skip(f"the candidate knows x86_64's system-call numbers only: {report['arch']}")
    _assert_blocked(report, ("keyctl", "bpf", "io_uring_setup", "finit_module", "clone_newuser"), sandbox, exactly="EPERM")
    assert report["clone3_newuser"] in ("blocked: ENOSYS", "blocked: EPERM"), f"{dict(report)}; {_doctor_says(sandbox)}"


# -- 10. the host's password hashes -----------------------------------------------------------------------------
async def test_etc_shadow_reads_empty_or_not_at_all(server, sandbox):
    _require(sandbox, "shadow")
    async with server.session() as client:
        report = await _attack(client, "shadow")
    _assert_blocked(report, ("/etc/shadow", "/etc/gshadow"), sandbox)


# -- control: an honest candidate, through the same server, after all of the above ---------------------------------
async def test_an_honest_candidate_still_verifies_correct(server, candidate):
    async with server.session() as client:
        result = await client.call_tool("verify_against_reference", {
            "backend": "cpu", "problem": "relu", "candidate_code": _unique(candidate("relu_python")), "trials": 2,
            "wait_s": 300})
    assert not result.is_error and result.structured_content["correct"] is True, result.content[0].text
