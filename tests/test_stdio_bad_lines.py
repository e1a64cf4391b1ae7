"""Issue 17: a line the server cannot parse gets a JSON-RPC error (id null, -32700 or -32600), and the server
goes on answering. Raw pipes to a real `kforge serve` over stdio (an SDK client would not send such lines);
the same bodies POSTed to the HTTP transport get a 400 with a JSON-RPC error."""

from __future__ import annotations

import json
import select
import subprocess
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import httpx2
import pytest

from .conftest import HttpServer, kforge_command, server_env

PARSE_ERROR, INVALID_REQUEST = -32700, -32600

# (test id, the line's bytes, the code it must get)
BAD_LINES = [
    ("not-json", b"not json", PARSE_ERROR),
    ("truncated", b'{"jsonrpc":"2.0","id":3,"method":"tools/list"', PARSE_ERROR),
    ("nested-300-arrays", b"[" * 300 + b"]" * 300, PARSE_ERROR),
    ("nested-300-objects", b'{"a":' * 300 + b"1" + b"}" * 300, PARSE_ERROR),
    ("lone-surrogate", b'{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"x":"\\ud800"}}', PARSE_ERROR),
    ("invalid-utf8", b'\xff\xfe{"jsonrpc":"2.0","id":5,"method":"tools/list"}', PARSE_ERROR),
    ("number", b"42", INVALID_REQUEST),
    ("string", b'"tools/list"', INVALID_REQUEST),
    ("empty-batch", b"[]", INVALID_REQUEST),
    ("no-method-no-id", b'{"jsonrpc":"2.0"}', INVALID_REQUEST),
    ("wrong-version", b'{"jsonrpc":"1.0","id":6,"method":"tools/list"}', INVALID_REQUEST),
    ("method-not-a-string", b'{"jsonrpc":"2.0","id":7,"method":7}', INVALID_REQUEST),
]


class StdioServer:
    """`kforge serve` over stdio with raw pipes: bytes in, one JSON object per line out."""

    def __init__(self, home: Path) -> None:
        self.errlog = open(home / "server-stderr.log", "a")  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen([*kforge_command(), "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errlog, env=server_env(home, KFORGE_WARM_WORKERS="0"))
        self.ids = count(1)

    def send(self, line: bytes) -> None:
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float = 60) -> dict | None:
        """The next line the server writes, or None if none comes within `timeout` s."""
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            return None
        line = self.proc.stdout.readline()
        assert line, f"the server closed stdout (exit {self.proc.poll()}); see {self.errlog.name}"
        return json.loads(line)

    def request(self, method: str, params: dict | None = None) -> dict:
        """Send a request, return its response (lines before it are not expected here)."""
        rid = next(self.ids)
        self.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                              **({"params": params} if params is not None else {})}).encode())
        reply = self.receive()
        assert reply is not None and reply.get("id") == rid, f"no reply to {method} #{rid}: {reply}"
        return reply

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.errlog.close()


def _initialize(server: StdioServer) -> None:
    reply = server.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                          "clientInfo": {"name": "bad-lines-test", "version": "0"}})
    assert "result" in reply, reply
    server.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')


@pytest.fixture(scope="module")
def stdio_server(tmp_path_factory) -> Iterator[StdioServer]:
    server = StdioServer(tmp_path_factory.mktemp("stdio-bad-lines"))
    try:
        _initialize(server)
        yield server
    finally:
        server.close()


def _assert_error(reply: dict | None, code: int, what: str) -> None:
    assert reply is not None, f"no reply to the bad line ({what}): the client would wait forever"
    assert reply.get("jsonrpc") == "2.0" and "id" in reply and reply["id"] is None, reply
    assert "result" not in reply, reply
    assert reply["error"]["code"] == code, reply
    message = reply["error"]["message"]
    assert isinstance(message, str) and 0 < len(message) <= 300, message


@pytest.mark.parametrize(("line", "code"), [pytest.param(line, code, id=name) for name, line, code in BAD_LINES])
def test_stdio_bad_line_gets_error_then_serves(stdio_server: StdioServer, line: bytes, code: int) -> None:
    stdio_server.send(line)
    _assert_error(stdio_server.receive(timeout=30), code, repr(line[:40]))
    assert stdio_server.request("tools/list")["result"]["tools"]
    assert stdio_server.proc.poll() is None


def test_stdio_bad_line_before_initialize(tmp_path: Path) -> None:
    """The very first line is garbage: answered too, and the handshake still works after it."""
    server = StdioServer(tmp_path)
    try:
        server.send(b"[" * 300 + b"]" * 300)
        _assert_error(server.receive(), PARSE_ERROR, "nesting before initialize")
        _initialize(server)
        assert server.request("tools/list")["result"]["tools"]
    finally:
        server.close()


def test_stdio_error_message_says_what_was_wrong(stdio_server: StdioServer) -> None:
    stdio_server.send(b"[" * 300 + b"]" * 300)
    message = stdio_server.receive(timeout=30)["error"]["message"]
    assert "parse error" in message.lower() and "recursion" in message.lower(), message
    stdio_server.send(b"42")
    message = stdio_server.receive(timeout=30)["error"]["message"]
    assert "invalid request" in message.lower(), message


def test_stdio_invalid_utf8_inside_a_string_is_still_answered(stdio_server: StdioServer) -> None:
    """The SDK decodes stdin with errors="replace": a bad byte inside a string becomes U+FFFD and the request is
    served. What matters for the issue: a reply comes, with the request's id."""
    stdio_server.send(b'{"jsonrpc":"2.0","id":"utf8","method":"tools/list","params":{"_meta":{"x":"\xed\xa0\x80"}}}')
    reply = stdio_server.receive(timeout=30)
    assert reply is not None and reply["id"] == "utf8", reply


# ---- the same bodies over HTTP: the SDK's streamable-HTTP transport answers 400 with a JSON-RPC error ----

@pytest.fixture(scope="module")
def http_bad_lines(tmp_path_factory) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path_factory.mktemp("http-bad-lines"), KFORGE_WARM_WORKERS="0")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(("body", "code"), [pytest.param(line, code, id=name) for name, line, code in BAD_LINES])
def test_http_bad_body_gets_400_and_jsonrpc_error(http_bad_lines: HttpServer, body: bytes, code: int) -> None:
    response = httpx2.post(http_bad_lines.url, content=body, timeout=60,
                           headers={"Content-Type": "application/json",
                                    "Accept": "application/json, text/event-stream"})
    assert response.status_code == 400, (response.status_code, response.text)
    reply = response.json()
    assert reply.get("jsonrpc") == "2.0" and reply.get("id", "absent") is None, reply
    # The SDK says -32602 (invalid params) for valid JSON that is no JSON-RPC message; JSON-RPC 2.0 says -32600.
    assert reply["error"]["code"] in ((PARSE_ERROR,) if code == PARSE_ERROR else (INVALID_REQUEST, -32602)), reply
    assert http_bad_lines.proc.poll() is None
