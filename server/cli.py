"""The `kforge` command line: `kforge serve` (MCP over stdio or HTTP) and `kforge doctor`."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import sys
import warnings

import anyio

from kforge import __version__

from .settings import Settings, analyst_config

__all__ = ["main"]

_LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    from .app import build_server

    # stdout is the MCP wire on stdio: everything we log goes to stderr.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="kforge %(levelname)s %(message)s")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    mcp = build_server(settings)
    if args.transport == "stdio":
        mcp.run("stdio")
        return 0
    if not _is_loopback(args.host):
        print(f"kforge: refusing to serve HTTP on {args.host}: only loopback addresses are allowed until "
              "token authentication is configured. Use --host 127.0.0.1 and an SSH tunnel "
              "(ssh -L 8765:127.0.0.1:8765 gpu-host), or run `ssh gpu-host kforge serve` over stdio.",
              file=sys.stderr)
        return 2
    print(f"kforge {__version__}: MCP over streamable HTTP at http://{args.host}:{args.port}/mcp "
          f"(data in {settings.home})", file=sys.stderr)
    mcp.run("streamable-http", host=args.host, port=args.port, streamable_http_path="/mcp")
    return 0


def _doctor(args: argparse.Namespace, settings: Settings) -> int:
    from .settings import tool_context

    tools = tool_context(settings)

    async def gather() -> tuple[list, dict]:
        found = await tools.availability()
        facts = {}
        if args.measure:  # ceilings: measured once per device, then read from the cache
            for a in found:
                if a.ok and a.timing:
                    facts[a.backend] = await tools.device_facts(a.backend, remeasure=args.remeasure)
        return found, facts

    found, facts = anyio.run(gather)
    if args.json:
        print(json.dumps({"kforge": __version__, "home": str(settings.home),
                          "backends": [a.model_dump(mode="json") for a in found],
                          "devices": {k: v.model_dump(mode="json") for k, v in facts.items()}}, indent=1))
        return 0 if any(a.ok for a in found) else 1
    print(f"kforge {__version__}; data directory {settings.home}")
    for a in found:
        mark = "ok " if a.ok else "-- "
        print(f"{mark} {a.backend:8s} {a.reason}" + (f" [{a.device_name}]" if a.device_name else ""))
        for tool, version in a.versions.items():
            print(f"       {tool}: {version}")
        if a.backend in facts:
            f = facts[a.backend]
            rates = ", ".join(f"{dtype} {rate:g} TFLOP/s" for dtype, rate in f.peak_tflops.items())
            print(f"       measured ceilings: copy {f.peak_bandwidth_gbs:g} GB/s; matmul {rates}")
    return 0 if any(a.ok for a in found) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kforge", description="KForge: an MCP server for kernel generation agents.")
    parser.add_argument("--version", action="version", version=f"kforge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve MCP (stdio by default, for desktop clients)")
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1", help="HTTP: address to bind (loopback only for now)")
    serve.add_argument("--port", type=int, default=8765, help="HTTP: port (default 8765)")
    doctor = sub.add_parser("doctor", help="say which backends this host offers and why others are missing")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--no-measure", dest="measure", action="store_false",
                        help="skip the device ceilings (copy bandwidth, matmul rates; measured once per device)")
    doctor.add_argument("--remeasure", action="store_true", help="measure the ceilings again instead of reading the cache")
    args = parser.parse_args(argv)
    try:
        settings = Settings()
        analyst_config(settings)  # a misconfigured analyst stops here, with what to set
    except ValueError as exc:  # pydantic's ValidationError included
        print(f"kforge: configuration error: {exc}", file=sys.stderr)
        return 2
    handler = {"serve": _serve, "doctor": _doctor}[args.command]
    return handler(args, settings)


if __name__ == "__main__":
    sys.exit(main())
