"""`kforge serve --transport http`: the SDK's streamable-HTTP app under uvicorn, with the guards a
remote host needs: a bearer token beyond loopback, a Host/Origin allowlist against DNS rebinding,
a request size limit, and TLS when given a certificate."""

from __future__ import annotations

import ipaddress
import socket
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

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
    app = mcp.streamable_http_app(streamable_http_path="/mcp", transport_security=security, host=host,
                                  max_request_body_size=int(settings.max_request_mb * 2**20))
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
