"""Shared fixtures: a real `kforge serve` process reached through the MCP SDK's own client.

The data directory (and so the C++ build cache) is shared by the whole session, so each
distinct kernel is compiled once (about 30 s on 2 cores) however many tests use it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import anyio
import httpx2
import pytest

from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

HERE = Path(__file__).parent
CANDIDATES = HERE / "candidates"
EXAMPLES = HERE.parent / "resources" / "examples"


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where a GPU is present (scripts/run_gpu_tests.sh on a GPU host)."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run scripts/run_gpu_tests.sh on a GPU host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="session")
def kforge_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kforge-home")


def kforge_command() -> list[str]:
    """The installed console script, as a user runs it; `python -m` where it is not on PATH."""
    exe = shutil.which("kforge")
    return [exe] if exe else [sys.executable, "-m", "kforge.server.cli"]


def server_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH", "CXX", "CC")}
    env["KFORGE_HOME"] = str(home)
    # Tests that are not about jobs want the answer, however slow a cold C++ build is on a busy CI machine;
    # the job tests pass wait_s themselves.
    env["KFORGE_JOB_WAIT_S"] = env["KFORGE_JOB_MAX_WAIT_S"] = "1800"
    # A background header precompile (a minute of both CI cores) per flag set would slow every test
    # after it; tests/test_build_cache.py turns it on where it is the subject.
    env["KFORGE_PRECOMPILED_HEADERS"] = "false"
    env.update(extra)
    return env


@asynccontextmanager
async def stdio_session(home: Path, *, mode: str = "auto", **env: str) -> AsyncIterator[Client]:
    cmd = kforge_command()
    params = StdioServerParameters(command=cmd[0], args=[*cmd[1:], "serve"], env=server_env(home, **env))
    errlog = open(home / "server-stderr.log", "a")
    try:
        async with Client(stdio_client(params, errlog=errlog), mode=mode) as client:
            yield client
    finally:
        errlog.close()


async def stored_once_added(client, profile_id: str, name: str, wait_s: float = 60.0) -> dict:
    """The stored profile (`kforge://profiles/{id}`) once its pending baseline `name` was added."""
    deadline = time.monotonic() + wait_s
    while True:
        stored = json.loads((await client.read_resource(f"kforge://profiles/{profile_id}")).contents[0].text)
        [b] = [b for b in stored["report"]["baselines"] if b["name"] == name]
        if not b.get("pending"):
            assert not b.get("error"), b
            return stored
        assert time.monotonic() < deadline, f"{name} still pending after {wait_s:.0f} s"
        await anyio.sleep(0.25)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    """`kforge serve --transport http` on a free port; `token` goes in KFORGE_TOKEN, `ca` makes it HTTPS."""

    def __init__(self, home: Path, *args: str, token: str | None = None, ca: Path | None = None,
                 host: str = "127.0.0.1", **env: str) -> None:
        self.port = free_port()
        self.token, self.ca = token, ca
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{self.port}/mcp"
        self.log_path = home / f"http-server-{self.port}.log"
        self.log = open(self.log_path, "a")
        if token is not None:
            env["KFORGE_TOKEN"] = token
        self.proc = subprocess.Popen([*kforge_command(), "serve", "--transport", "http", "--host", host,
                                      "--port", str(self.port), *args],
                                     env=server_env(home, **env), stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kforge serve exited with {self.proc.returncode}; see {self.log.name}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("kforge serve --transport http did not start listening within 60 s")

    @asynccontextmanager
    async def session(self, *, mode: str = "auto", token: str | None = None) -> AsyncIterator[Client]:
        """An MCP client session; with the server's token unless `token` says otherwise."""
        token = token if token is not None else self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        verify = ssl.create_default_context(cafile=str(self.ca)) if self.ca else True
        async with httpx2.AsyncClient(headers=headers, verify=verify,
                                      timeout=httpx2.Timeout(30, read=1800)) as http:
            async with Client(streamable_http_client(self.url, http_client=http), mode=mode) as client:
                yield client

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def http_server(kforge_home):
    server = HttpServer(kforge_home)
    yield server
    server.stop()


def read(path: Path) -> str:
    return path.read_text()


@pytest.fixture(scope="session")
def cpu_example() -> dict[str, str]:
    return {"reference": read(EXAMPLES / "cpu" / "reference.py"), "candidate": read(EXAMPLES / "cpu" / "candidate.py")}


def candidate_path(name: str) -> Path:
    """A test candidate by name; `example_<backend>` is the served example (so the tests verify it)."""
    if name.startswith("example_"):
        return EXAMPLES / name.removeprefix("example_") / "candidate.py"
    return CANDIDATES / f"{name}.py"


@pytest.fixture(scope="session")
def candidate():
    return lambda name: read(candidate_path(name))
