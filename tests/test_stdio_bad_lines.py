"""Issue 17: a line the server cannot parse gets a JSON-RPC error (-32700 when no JSON, invalid UTF-8 anywhere
included; -32600 when JSON but no JSON-RPC message), with the line's id where it has a usable one (a string or an
integer) and null otherwise, and a short message that names the problem without quoting the line; nothing of it is
served and the server goes on answering. Raw pipes to a real `kforge serve` over stdio (an SDK client would not
send such lines); the same bodies POSTed to the HTTP transport, in both protocol eras, get a 400 with the same
JSON-RPC error."""

from __future__ import annotations

import json
import select
import subprocess
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import anyio
import httpx2
import pytest

from .conftest import HttpServer, kforge_command, server_env

PARSE_ERROR, INVALID_REQUEST = -32700, -32600

# (test id, the line's bytes, the code it must get, the id it must get)
BAD_LINES = [
    ("not-json", b"not json", PARSE_ERROR, None),
    ("truncated", b'{"jsonrpc":"2.0","id":3,"method":"tools/list"', PARSE_ERROR, None),
    ("nested-300-arrays", b"[" * 300 + b"]" * 300, PARSE_ERROR, None),
    ("nested-300-objects", b'{"a":' * 300 + b"1" + b"}" * 300, PARSE_ERROR, None),
    ("lone-surrogate", b'{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"x":"\\ud800"}}', PARSE_ERROR, None),
    ("invalid-utf8", b'\xff\xfe{"jsonrpc":"2.0","id":5,"method":"tools/list"}', PARSE_ERROR, None),
    # invalid UTF-8 inside a string: once decoded as U+FFFD and served (stdio), now no JSON at all
    ("invalid-utf8-in-a-string", b'{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{"x":"\xff"}}',
     PARSE_ERROR, None),
    ("utf8-encoded-surrogate-in-a-string",
     b'{"jsonrpc":"2.0","id":10,"method":"tools/list","params":{"x":"\xed\xa0\x80"}}', PARSE_ERROR, None),
    ("number", b"42", INVALID_REQUEST, None),
    ("string", b'"tools/list"', INVALID_REQUEST, None),
    ("empty-batch", b"[]", INVALID_REQUEST, None),
    ("batch", b'[{"jsonrpc":"2.0","id":11,"method":"tools/list"}]', INVALID_REQUEST, None),
    ("no-method-no-id", b'{"jsonrpc":"2.0"}', INVALID_REQUEST, None),
    ("wrong-version", b'{"jsonrpc":"1.0","id":6,"method":"tools/list"}', INVALID_REQUEST, 6),
    ("method-not-a-string", b'{"jsonrpc":"2.0","id":7,"method":7}', INVALID_REQUEST, 7),
    ("string-id", b'{"jsonrpc":"2.0","id":"abc","method":7}', INVALID_REQUEST, "abc"),
    ("params-not-an-object", b'{"jsonrpc":"2.0","id":9,"method":"tools/list","params":[1]}', INVALID_REQUEST, 9),
    # an id JSON-RPC does not allow cannot be echoed
    ("bool-id", b'{"jsonrpc":"2.0","id":true,"method":7}', INVALID_REQUEST, None),
    ("float-id", b'{"jsonrpc":"2.0","id":1.5,"method":7}', INVALID_REQUEST, None),
    ("object-id", b'{"jsonrpc":"2.0","id":{"a":1},"method":7}', INVALID_REQUEST, None),
    # a well-formed call with an id MCP does not allow: the SDK took it for a notification and never answered
    ("bool-id-good-method", b'{"jsonrpc":"2.0","id":true,"method":"tools/list"}', INVALID_REQUEST, None),
    ("null-id-good-method", b'{"jsonrpc":"2.0","id":null,"method":"tools/list"}', INVALID_REQUEST, None),
    ("float-id-good-method", b'{"jsonrpc":"2.0","id":2.5,"method":"ping"}', INVALID_REQUEST, None),
    ("list-id-good-method", b'{"jsonrpc":"2.0","id":[1],"method":"ping"}', INVALID_REQUEST, None),
]
CASES = [pytest.param(line, code, rid, id=name) for name, line, code, rid in BAD_LINES]


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


def _assert_error(reply: dict | None, code: int, rid: int | str | None, line: bytes) -> None:
    """`reply` is the JSON-RPC error `line` must get: its code, its id (exactly: 1 is no True), a short message."""
    assert reply is not None, f"no reply to the bad line ({line[:40]!r}): the client would wait forever"
    assert reply.get("jsonrpc") == "2.0" and "id" in reply and "result" not in reply, reply
    assert reply["id"] == rid and type(reply["id"]) is type(rid), reply
    assert reply["error"]["code"] == code, reply
    message = reply["error"]["message"]
    assert isinstance(message, str) and 0 < len(message) <= 200, message
    assert message.startswith("Parse error" if code == PARSE_ERROR else "Invalid Request"), message
    # the problem named, the line not quoted (the SDK's pydantic dump quoted it, as input_value=...)
    assert "input_value" not in message and "tools/list" not in message and "jsonrpc\":" not in message, message
    text = line.decode(errors="replace")
    assert len(text) < 8 or text not in message, message


@pytest.mark.parametrize(("line", "code", "rid"), CASES)
def test_stdio_bad_line_gets_error_then_serves(stdio_server: StdioServer, line: bytes, code: int,
                                               rid: int | str | None) -> None:
    stdio_server.send(line)
    _assert_error(stdio_server.receive(timeout=30), code, rid, line)
    # the next line out is the answer to the next request: nothing of the bad line was served
    assert stdio_server.request("tools/list")["result"]["tools"]
    assert stdio_server.proc.poll() is None


def test_stdio_bad_line_before_initialize(tmp_path: Path) -> None:
    """The very first line is garbage: answered too, and the handshake still works after it."""
    server = StdioServer(tmp_path)
    try:
        server.send(b"[" * 300 + b"]" * 300)
        _assert_error(server.receive(), PARSE_ERROR, None, b"[" * 300 + b"]" * 300)
        server.send(b'{"jsonrpc":"2.0","id":"early","method":7}')
        _assert_error(server.receive(), INVALID_REQUEST, "early", b"")
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


def test_stdio_invalid_utf8_inside_a_string_is_not_served(stdio_server: StdioServer) -> None:
    """The SDK decodes stdin with errors="replace": a request whose string held a bad byte was served with U+FFFD
    in its place. Now it is a parse error, with id null (the request could not be read), and nothing else comes."""
    for bad in (b"\xff", b"\xed\xa0\x80", b"\xc3"):
        stdio_server.send(b'{"jsonrpc":"2.0","id":"utf8","method":"tools/list","params":{"_meta":{"x":"' + bad + b'"}}}')
        reply = stdio_server.receive(timeout=30)
        _assert_error(reply, PARSE_ERROR, None, b"")
        assert "unicode" in reply["error"]["message"].lower(), reply
        assert stdio_server.receive(timeout=1) is None  # no reply with id "utf8" follows
    # valid UTF-8 beyond ASCII is no problem
    assert stdio_server.request("tools/list", {"_meta": {"x": "\u00e9\u4e2d\U0001f600"}})["result"]["tools"]


# ---- the same bodies over HTTP: 400 with the same JSON-RPC error, in both protocol eras ----

MODERN = "2026-07-28"
ACCEPT = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
ERAS = {"legacy": {}, "2026": {"MCP-Protocol-Version": MODERN}}  # no version header: the handshake era's path


@pytest.fixture(scope="module")
def http_bad_lines(tmp_path_factory) -> Iterator[HttpServer]:
    # a small body limit (about 50 KiB), to see that the limit still answers first
    server = HttpServer(tmp_path_factory.mktemp("http-bad-lines"), KFORGE_WARM_WORKERS="0",
                        KFORGE_MAX_REQUEST_MB="0.05")
    try:
        yield server
    finally:
        server.stop()


def _post(server: HttpServer, body, **headers: str) -> httpx2.Response:
    return httpx2.post(server.url, content=body, timeout=60, headers={**ACCEPT, **headers})


def _modern_request(rid: int, method: str, params: dict | None = None) -> dict:
    """A 2026-07-28 request: version and capabilities travel in each request's _meta, no session needed."""
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    params = dict(params or {})
    params["_meta"] = {**meta, **params.get("_meta", {})}
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def _reply(response: httpx2.Response) -> dict:
    """The JSON-RPC reply in a JSON body or in an SSE stream's last message."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads([d for d in data if d][-1])
    return response.json()


def _http_tools_list(server: HttpServer) -> list:
    """tools/list by a raw 2026 POST; the tools it lists."""
    response = _post(server, json.dumps(_modern_request(99, "tools/list")), **{"MCP-Protocol-Version": MODERN,
                                                                               "Mcp-Method": "tools/list"})
    assert response.status_code == 200, (response.status_code, response.text)
    reply = _reply(response)
    assert reply["id"] == 99, reply
    return reply["result"]["tools"]


@pytest.mark.parametrize("era", list(ERAS))
@pytest.mark.parametrize(("body", "code", "rid"), CASES)
def test_http_bad_body_gets_400_and_jsonrpc_error(http_bad_lines: HttpServer, body: bytes, code: int,
                                                  rid: int | str | None, era: str) -> None:
    response = _post(http_bad_lines, body, **ERAS[era])
    assert response.status_code == 400, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/json", response.headers
    _assert_error(response.json(), code, rid, body)  # -32600 where the SDK said -32602 with a pydantic dump
    assert _http_tools_list(http_bad_lines)
    assert http_bad_lines.proc.poll() is None


@pytest.mark.parametrize("bad", [b"\xff", b"\xed\xa0\x80"])
def test_http_invalid_utf8_inside_a_string_is_not_served(http_bad_lines: HttpServer, bad: bytes) -> None:
    """A request the 2026 path would serve but for a bad byte in a string (its json.loads took UTF-8-encoded
    surrogates): a parse error, where the same request with good bytes is served."""
    good = json.dumps(_modern_request(12, "tools/list", {"_meta": {"x": "PLACEHOLDER"}})).encode()
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"}
    assert _reply(_post(http_bad_lines, good, **headers))["result"]["tools"]
    response = _post(http_bad_lines, good.replace(b"PLACEHOLDER", bad), **headers)
    assert response.status_code == 400, (response.status_code, response.text)
    _assert_error(response.json(), PARSE_ERROR, None, b"")


def test_http_checks_before_the_body_keep_their_answers(http_bad_lines: HttpServer) -> None:
    """A bad body is judged only when the SDK reads it: its Host, Content-Type and size checks answer first."""
    bad = b'{"jsonrpc":"2.0","id":7,"method":7}'
    assert _post(http_bad_lines, bad, Host="attacker.example").status_code == 421
    plain = _post(http_bad_lines, bad, **{"Content-Type": "text/plain"})
    assert plain.status_code in (400, 415) and "not a JSON-RPC" not in plain.text, plain.text
    big = b'{"jsonrpc":"2.0","id":7,"method":7,"params":{"x":"' + b"a" * 100_000 + b'"}}'
    assert _post(http_bad_lines, big).status_code == 413  # declared too big (Content-Length)

    def chunks():  # no Content-Length: the limit is found while reading
        yield big[:60_000]
        yield big[60_000:]
    assert _post(http_bad_lines, chunks()).status_code == 413
    assert _http_tools_list(http_bad_lines)


def test_http_sdk_client_serves_after_bad_bodies(http_bad_lines: HttpServer) -> None:
    """An SDK client, in the handshake era and the 2026 one, is served after bad bodies."""
    for _, line, _, _ in BAD_LINES:
        assert _post(http_bad_lines, line).status_code == 400

    async def tools(mode: str) -> list:
        async with http_bad_lines.session(mode=mode) as client:
            return (await client.list_tools()).tools

    assert anyio.run(tools, "legacy") and anyio.run(tools, "auto")
