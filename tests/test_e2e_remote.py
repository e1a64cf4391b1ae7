"""A remote GPU host, on loopback: `kforge serve --transport http` with a token, reached through the MCP
SDK's client and through raw HTTP for what a client would never send (no token, a foreign Host).

Covers access (401s, refused binds, DNS rebinding, body limits, TLS), long work as jobs (handles,
get_job from another connection, cancel with the worker's process group, a killed server's jobs
resumed by the next one, busy queues) and what workers cannot reach (secrets, the network)."""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import anyio
import pytest

from mcp import MCPError

from .conftest import HttpServer, kforge_command, server_env

pytestmark = pytest.mark.anyio

TOKEN = secrets.token_urlsafe(32)
API_KEY = "sk-ant-test-" + secrets.token_hex(8)
_INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    home = tmp_path_factory.mktemp("remote-home")
    server = HttpServer(home, token=TOKEN, KFORGE_MAX_REQUEST_MB="1", ANTHROPIC_API_KEY=API_KEY)
    yield server
    server.stop()


def _post(server: HttpServer, body: str | bytes, **headers: str) -> tuple[int, dict[str, str]]:
    """A raw POST to the MCP endpoint (http.client, so any Host header can be sent)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.putrequest("POST", "/mcp", skip_host="Host" in headers)
        sent = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers}
        data = body.encode() if isinstance(body, str) else body
        for name, value in {**sent, "Content-Length": str(len(data))}.items():
            conn.putheader(name, value)
        conn.endheaders()
        conn.send(data)
        reply = conn.getresponse()
        reply.read()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}
    finally:
        conn.close()


def _source(name: str, **subs: str) -> str:
    text = (Path(__file__).parent / "candidates" / f"{name}.py").read_text()
    for key, value in subs.items():
        text = text.replace(f"__{key}__", value)
    return text


def _unique(code: str) -> str:
    """A distinct candidate text, so no stored answer or running job is reused."""
    return f"{code}\n# {secrets.token_hex(8)}\n"


# -- access ------------------------------------------------------------------------------------
def test_requests_without_the_right_token_get_401(remote):
    status, headers = _post(remote, _INIT)
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    wrong = secrets.token_urlsafe(32)
    status, headers = _post(remote, _INIT, Authorization=f"Bearer {wrong}")
    assert status == 401 and 'error="invalid_token"' in headers["www-authenticate"]
    status, _ = _post(remote, _INIT, Authorization=f"Bearer {TOKEN}")
    assert status == 200
    log = remote.log_path.read_text()
    assert TOKEN not in log and wrong not in log


async def test_an_mcp_client_with_a_wrong_token_cannot_connect(remote):
    with pytest.raises(BaseExceptionGroup) as caught:  # the SDK's transport task group wraps it
        async with remote.session(token=secrets.token_urlsafe(32)) as client:
            await client.list_tools()
    assert caught.group_contains(MCPError, match="Server returned an error response")
    async with remote.session() as client:  # the right one can
        names = {t.name for t in (await client.list_tools()).tools}
    assert {"compile_kernel", "get_job", "cancel_job"} <= names


def test_a_foreign_host_or_origin_is_refused(remote):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, _ = _post(remote, _INIT, Host=f"attacker.example:{remote.port}", **auth)
    assert status == 421  # DNS rebinding: a page on attacker.example resolving to 127.0.0.1
    status, _ = _post(remote, _INIT, Origin="http://attacker.example", **auth)
    assert status == 403
    status, _ = _post(remote, _INIT, Host=f"localhost:{remote.port}", Origin=f"http://localhost:{remote.port}", **auth)
    assert status == 200


def test_an_oversized_request_gets_413(remote):
    big = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "compile_kernel", "arguments": {"candidate_code": "#" * 2_000_000}}})
    status, _ = _post(remote, big, Authorization=f"Bearer {TOKEN}")
    assert status == 413  # KFORGE_MAX_REQUEST_MB=1 in this server


def _serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*kforge_command(), "serve", "--transport", "http", *args], env=server_env(tmp_path, **env),
                          capture_output=True, text=True, timeout=60)


def test_weak_or_exposed_tokens_and_half_tls_are_refused(tmp_path):
    short = _serve(tmp_path, "--host", "0.0.0.0", "--port", "1", KFORGE_TOKEN="tooshort")
    assert short.returncode == 2 and "has 8 characters; use at least 32" in short.stderr
    assert "tooshort" not in short.stderr
    exposed = tmp_path / "token"
    exposed.write_text(TOKEN)
    exposed.chmod(0o644)
    shared = _serve(tmp_path, "--port", "1", "--token-file", str(exposed))
    assert shared.returncode == 2 and "readable by other users: chmod 600" in shared.stderr
    half = _serve(tmp_path, "--port", "1", "--certfile", str(exposed), KFORGE_TOKEN=TOKEN)
    assert half.returncode == 2 and "needs both a certificate and its key" in half.stderr


async def test_an_open_bind_with_a_token_file_serves_only_that_token(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    server = HttpServer(tmp_path, "--token-file", str(token_file), host="0.0.0.0")
    try:
        server.token = TOKEN
        async with server.session() as client:
            assert (await client.call_tool("list_backends", {})).structured_content["backends"]
        assert _post(server, _INIT)[0] == 401
    finally:
        server.stop()
    assert "bearer token read from" in server.log_path.read_text() and TOKEN not in server.log_path.read_text()


async def test_tls_with_a_certificate_and_key(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = HttpServer(tmp_path, "--certfile", str(cert), "--keyfile", str(key), token=TOKEN, ca=cert)
    try:
        async with server.session() as client:
            assert (await client.call_tool("list_backends", {})).structured_content["backends"]
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            _post(server, _INIT, Authorization=f"Bearer {TOKEN}")  # plain HTTP to a TLS port
    finally:
        server.stop()
    assert f"https://127.0.0.1:{server.port}/mcp" in server.log_path.read_text()


# -- jobs --------------------------------------------------------------------------------------
async def test_a_job_outlives_its_client_and_another_client_fetches_it(remote):
    code = _unique(_source("slow_import"))
    async with remote.session() as first:
        handle = await first.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": code, "wait_s": 0})
        assert not handle.is_error and handle.structured_content["status"] in ("queued", "running")
        job_id = handle.structured_content["job_id"]
        assert f'get_job(job_id="{job_id}")' in handle.content[0].text
        again = await first.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": code, "wait_s": 0})
        assert again.structured_content["job_id"] == job_id  # a repeated call attaches; nothing runs twice
    # the first client is gone; a new connection (the other protocol era too) picks the job up
    seen = []

    async def on_progress(done, total, message):
        seen.append(message)

    async with remote.session(mode="legacy") as second:
        listed = json.loads((await second.read_resource("kforge://jobs")).contents[0].text)
        assert job_id in [j["job_id"] for j in listed]
        result = await second.call_tool("get_job", {"job_id": job_id, "wait_s": 300}, progress_callback=on_progress)
    assert not result.is_error and result.structured_content["ok"] is True, result.content[0].text
    assert result.content[0].text.startswith("Built OK")
    assert "building the candidate in a worker" in seen


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _tagged_sleeper(tag: str) -> tuple[int, int] | None:
    """(worker, child) as this host sees them: the `sleep 600.<tag>` process and its parent."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == f"sleep\x00600.{tag}\x00".encode():
                stat = Path(f"/proc/{pid}/stat").read_text()
                return int(stat[stat.rindex(")") + 2:].split()[1]), int(pid)
        except OSError:
            continue
    return None


async def test_cancel_kills_the_worker_and_everything_it_started(remote, tmp_path):
    tag = str(time.time_ns())
    code = _unique(_source("spawns_and_spins", TAG=tag))
    async with remote.session() as client:
        handle = await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": code, "wait_s": 0})
        job_id = handle.structured_content["job_id"]
        with anyio.fail_after(120):
            while (found := _tagged_sleeper(tag)) is None:
                await anyio.sleep(0.2)
        worker, child = found
        assert _alive(worker) and _alive(child)
        cancelled = await client.call_tool("cancel_job", {"job_id": job_id})
        assert not cancelled.is_error
        with anyio.fail_after(30):
            while (status := (await client.call_tool("get_job", {"job_id": job_id, "wait_s": 1})).structured_content
                   )["status"] != "cancelled":
                pass
        assert "worker processes were killed" in status["message"]
        deadline = time.monotonic() + 10
        while (_alive(worker) or _alive(child)) and time.monotonic() < deadline:
            await anyio.sleep(0.1)
        assert not _alive(worker) and not _alive(child)
        missing = await client.call_tool("get_job", {"job_id": "nosuchjob"})
        assert missing.is_error and "no job 'nosuchjob'" in missing.content[0].text


async def test_workers_see_no_secrets_and_no_network(remote):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(20)
    connections = []

    def accept() -> None:
        try:
            connections.append(listener.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    code = _unique(_source("snoop", PORT=str(listener.getsockname()[1])))
    try:
        async with remote.session() as client:
            result = await client.call_tool("compile_kernel", {"backend": "cpu", "candidate_code": code, "wait_s": 300})
    finally:
        listener.close()
        thread.join(timeout=25)
    failure = result.structured_content["failure"]
    assert "snoop env=[]" in failure["message"], failure  # KFORGE_TOKEN and ANTHROPIC_API_KEY were set
    doctor = subprocess.run([*kforge_command(), "doctor", "--json", "--no-measure"], env=server_env(remote.log_path.parent),
                            capture_output=True, text=True, timeout=300)
    if json.loads(doctor.stdout)["worker_network"] != "isolated":
        pytest.skip(f"this OS gives workers no network namespace: {json.loads(doctor.stdout)['worker_network']}")
    assert "net=blocked" in failure["message"] and not connections


async def test_a_full_queue_answers_busy(tmp_path):
    server = HttpServer(tmp_path, token=TOKEN, KFORGE_PARALLEL_JOBS="1", KFORGE_QUEUE_LIMIT="1")
    try:
        async with server.session() as client:
            answers = [(await client.call_tool("compile_kernel", {
                "backend": "cpu", "candidate_code": _unique(_source("slow_import")), "wait_s": 0})).structured_content
                for _ in range(3)]
            assert [a["status"] for a in answers[:2]] == ["running", "queued"]
            busy = answers[2]
            assert busy["status"] == "busy" and busy["retry_after_s"] >= 1 and "job_id" not in busy
            for a in answers[:2]:
                await client.call_tool("cancel_job", {"job_id": a["job_id"]})
    finally:
        server.stop()


async def test_a_killed_server_loses_no_job(tmp_path):
    first = HttpServer(tmp_path, token=TOKEN)
    try:
        async with first.session() as client:
            handle = await client.call_tool("verify_against_reference", {
                "backend": "cpu", "problem": "relu", "candidate_code": _unique(_source("slow_import")), "trials": 2,
                "wait_s": 0})
            job_id = handle.structured_content["job_id"]
    finally:
        first.stop(signal.SIGKILL)  # no clean shutdown: the job is left "running" under a dead server
    left = [p.name for p in (tmp_path / "jobs").iterdir() if p.name.endswith(f"+{first.proc.pid}@{socket.gethostname()}")]
    assert left  # the job's scratch and the warm workers' directories, never removed by the dead server
    second = HttpServer(tmp_path, token=TOKEN)
    try:
        async with second.session() as client:
            result = await client.call_tool("get_job", {"job_id": job_id, "wait_s": 300})
    finally:
        second.stop()
    assert not result.is_error and result.structured_content["correct"] is True, result.content[0].text
    still = [name for name in left if (tmp_path / "jobs" / name).exists()]
    assert not still, still  # the next server on the data directory removed them
