"""`kforge serve --transport http`: the SDK's streamable-HTTP app under uvicorn, with the guards a
remote host needs: a bearer token beyond loopback, a Host/Origin allowlist against DNS rebinding,
a request size limit, and TLS when given a certificate; a body that is no JSON-RPC message gets the
JSON-RPC error that stdio gives it (_AnswerBadBodies)."""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import PARSE_ERROR

from .jsonrpc_errors import rejection
from .settings import Settings

__all__ = ["allowed_hosts", "is_loopback", "serve_http"]

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _with_ports(names: list[str]) -> list[str]:
    """Each name bare (a Host header without a port) and with any port."""
    out: list[str] = []
    for name in names:
        out += [name] if name.endswith(":*") else [name, f"{name}:*"]
    return list(dict.fromkeys(out))


def allowed_hosts(bind: str, extra: list[str]) -> list[str]:
    """Host headers to accept: loopback, this machine's own names and the bound address, and `extra`."""
    names = list(_LOOPBACK) + list(extra)
    if not is_loopback(bind):
        names += [socket.gethostname(), socket.getfqdn()]
        if bind not in ("0.0.0.0", "::", ""):
            names.append(f"[{bind}]" if ":" in bind else bind)
    return _with_ports(names)


def allowed_origins(hosts: list[str], extra: list[str]) -> list[str]:
    return list(dict.fromkeys([f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")] + list(extra)))


def serve_http(mcp: MCPServer, settings: Settings, *, host: str, port: int, has_token: bool) -> None:
    import uvicorn

    hosts = allowed_hosts(host, settings.allowed_hosts)
    security = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                         allowed_origins=allowed_origins(hosts, settings.allowed_origins))
    max_body = int(settings.max_request_mb * 2**20)
    app = _AnswerBadBodies(mcp.streamable_http_app(streamable_http_path="/mcp", transport_security=security,
                                                   host=host, max_request_body_size=max_body), "/mcp", max_body)
    tls = settings.certfile is not None
    scheme = "https" if tls else "http"
    shown = f"[{host}]" if ":" in host else host
    print(f"kforge: MCP over streamable HTTP at {scheme}://{shown}:{port}/mcp (data in {settings.home}); "
          f"{'bearer token required' if has_token else 'no token: loopback only'}; "
          f"Host headers accepted: {', '.join(h for h in hosts if not h.endswith(':*'))}", file=sys.stderr)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            ssl_certfile=str(settings.certfile) if tls else None,
                            ssl_keyfile=str(settings.keyfile) if settings.keyfile else None)
    uvicorn.Server(config).run()


class _AnswerBadBodies:
    """The SDK's HTTP app, where a POST body that is no JSON-RPC message gets jsonrpc_errors.rejection's answer
    (status 400), as the same line gets over stdio: the SDK's legacy path answers valid JSON of the wrong shape with
    -32602 and a pydantic dump quoting the body, its 2026 path takes a string with UTF-8-encoded surrogates, and
    neither echoes the request's id.

    The body is judged when the SDK reads it (after the token check, before Host/Origin, Content-Type and Accept,
    which the SDK checks on the body it has read). A rejected body is handed on empty, so that nothing of it can be
    served, and the SDK's answer to that is replaced by ours only where it is its parse error (400, -32700): an
    earlier refusal (421, 403, 406, 415, 404...) keeps its answer. A body over the limit is handed on as read, for
    the SDK's limit to refuse (413), so nothing more than the limit is held here. Good bodies and every reply to
    them pass through untouched; only the short reply to a rejected body is held."""

    def __init__(self, app, path: str, max_body: int) -> None:
        self.app, self.path, self.max_body = app, path, max_body

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        read, answer, held = False, None, []  # the body was read; our reply to it, if rejected; the SDK's reply

        async def receive_body():
            nonlocal read, answer
            if read:  # after the body: the disconnect a streamed reply waits for
                return await receive()
            read, body, more = True, bytearray(), True
            while more:
                message = await receive()
                if message["type"] != "http.request":  # the client left mid-body: the SDK sees that
                    return message
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > self.max_body:
                    return {"type": "http.request", "body": bytes(body), "more_body": more}
            if (error := rejection(bytes(body))) is None:
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            logging.getLogger(__name__).warning("a POST body got error %s: %s", error.error.code, error.error.message)
            answer = error.model_dump_json(by_alias=True, exclude_unset=True).encode()
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send_reply(message) -> None:
            if answer is None:
                await send(message)
                return
            held.append(message)
            if message["type"] != "http.response.body" or message.get("more_body", False):
                return
            if held[0]["status"] == 400 and _is_parse_error(b"".join(m.get("body", b"") for m in held[1:])):
                headers = [(k, v) for k, v in held[0].get("headers", [])
                           if k.lower() not in (b"content-length", b"content-type")]
                held[:] = [{"type": "http.response.start", "status": 400, "headers": headers + [
                              (b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]},
                           {"type": "http.response.body", "body": answer, "more_body": False}]
            for message in held:
                await send(message)

        await self.app(scope, receive_body, send_reply)


def _is_parse_error(body: bytes) -> bool:
    """Whether the SDK's reply is its JSON-RPC parse error (what it answers to the empty body _AnswerBadBodies gives)."""
    try:
        return json.loads(body)["error"]["code"] == PARSE_ERROR
    except (ValueError, TypeError, KeyError):
        return False
