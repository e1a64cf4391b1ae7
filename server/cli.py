"""The `kforge` command line: `kforge serve` (MCP over stdio or HTTP), `doctor`, `config <client>` and `prune`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from pathlib import Path

import anyio
from mcp.shared.message import SessionMessage

from kforge import __version__

from kforge.backends import Availability
from kforge.tools.disk import disk_usage, format_bytes, prune_caches
from kforge.tools.gpus import Placement, describe_gpu, placements

from .auth import MAKE_TOKEN
from .clients import CLIENTS, client_config, where_it_goes
from .jsonrpc_errors import rejection
from .settings import Settings, analyst_config, config_file, load_settings, settings_environment

__all__ = ["main", "parser"]

def _backends_line(found: list[Availability]) -> str:
    offered = [a.backend + (f" ({a.mode}, not timed)" if a.mode and not a.timing else "") for a in found if a.ok]
    missing = [f"{a.backend} ({a.reason})" for a in found if not a.ok]
    return f"backends {', '.join(offered) or 'none'}" + (f"; not here: {'; '.join(missing)}" if missing else "")


def _on_start(settings: Settings, where: str):
    """The banner (one line on stderr once the backends are probed), then the cache cap enforced in the background."""
    async def announce(tools) -> None:
        try:
            backends = _backends_line(await tools.availability())
        except Exception as exc:  # noqa: BLE001 - the banner must not take the server down; tools report it too
            backends = f"backends could not be probed ({type(exc).__name__}: {exc})"
        print(f"kforge {__version__}: serving MCP {where}; data directory {settings.home}; {backends}",
              file=sys.stderr, flush=True)
        if settings.cache_max_gb:
            report = await anyio.to_thread.run_sync(
                lambda: prune_caches(settings.home, max_bytes=int(settings.cache_max_gb * 1e9)))
            if report.removed:
                print(f"kforge: caches were over KFORGE_CACHE_MAX_GB={settings.cache_max_gb:g}: {report}",
                      file=sys.stderr, flush=True)
    return announce


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    # stdout is the MCP wire on stdio: everything we log goes to stderr.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="kforge %(levelname)s %(message)s")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    if settings.ray:
        from kforge.tools.fleet import FleetError, import_ray

        try:
            import_ray()  # said now, not at the first job
        except FleetError as exc:
            return _refuse(str(exc))
    try:
        return _serve_transport(args, settings)
    except Exception as exc:  # the lifespan's errors arrive grouped (task groups): a fleet's is said plainly
        from kforge.tools.fleet import FleetError

        fleet = [e for e in _leaves(exc) if isinstance(e, FleetError)]
        if fleet:
            _refuse(str(fleet[0]))
            sys.stderr.flush()
            os._exit(2)  # ray.init may still be retrying in a thread nothing can stop, which would keep us alive
        raise


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for e in group.exceptions for leaf in _leaves(e)]
    return [group]


def _serve_transport(args: argparse.Namespace, settings: Settings) -> int:
    from .app import build_server
    from .auth import TokenError, auth_arguments, load_token
    from .http import is_loopback, serve_http

    if args.transport == "stdio":
        anyio.run(_serve_stdio, build_server(settings, on_start=_on_start(settings, "over stdio")))
        return 0
    try:
        token, source = load_token(settings.token, settings.token_file)
    except TokenError as exc:
        return _refuse(str(exc))
    exposed = not is_loopback(args.host)
    if token is None and exposed:
        return _refuse(f"refusing to serve HTTP on {args.host} without a token: anyone who can reach the port could "
                       f"run code on this machine. Set KFORGE_TOKEN (or KFORGE_TOKEN_FILE) to a long random secret "
                       f"({MAKE_TOKEN}), or serve on 127.0.0.1 and reach it through "
                       "`ssh -L 8765:127.0.0.1:8765 gpu-host`, or run `ssh gpu-host kforge serve` over stdio.")
    if (settings.certfile is None) != (settings.keyfile is None):
        return _refuse("TLS needs both a certificate and its key: --certfile and --keyfile (KFORGE_CERTFILE, KFORGE_KEYFILE)")
    if token is not None and settings.certfile is None and exposed:
        print("kforge: warning: plain HTTP beyond loopback sends the token in clear text; give --certfile/--keyfile "
              "or put a TLS reverse proxy in front (README: Remote GPU hosts)", file=sys.stderr)
    if (missing := _sandbox_missing(settings)) and not settings.allow_partial_sandbox:
        return _refuse("refusing to serve HTTP: this host refuses part of the workers' sandbox, so candidates from "
                       f"the network would run with less isolation: {'; '.join(missing)}. Fix the host (README: "
                       "Security), or pass --allow-partial-sandbox (KFORGE_ALLOW_PARTIAL_SANDBOX=1) to accept it.")
    if token is not None:
        print(f"kforge: bearer token read from {source}", file=sys.stderr)
    scheme = "https" if settings.certfile else "http"
    where = f"over streamable HTTP at {scheme}://{args.host}:{args.port}/mcp" + (" (bearer token)" if token else "")
    serve_http(build_server(settings, auth=auth_arguments(token), on_start=_on_start(settings, where)), settings,
               host=args.host, port=args.port, has_token=token is not None)
    return 0


async def _serve_stdio(app) -> None:
    """`MCPServer.run_stdio_async`, except that stdin is read as bytes and a line that is no JSON-RPC message gets
    an answer (_StdinLines)."""
    from mcp.server.stdio import _claim_fd, _open_stdin_diversion, stdio_server

    server = app._lowlevel_server  # private, but the SDK has no public way to give it other streams
    # Giving stdio_server() our own stdin skips its claim of fd 0 (pointing it at /dev/null while serving, so that
    # children cannot read the wire): we make that claim with the SDK's own private helpers, to keep its behaviour.
    buffer, release = _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)
    stdin = _StdinLines(anyio.wrap_file(buffer))
    try:
        async with stdio_server(stdin=stdin) as (read_stream, write_stream):
            stdin.answer_to(write_stream)
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        if release is not None:
            release()


class _StdinLines:
    """stdin for the SDK's stdio reader: each line as bytes, where a line that is no JSON-RPC message is answered
    with a JSON-RPC error (jsonrpc_errors.rejection) and not passed on.

    Bytes, since the SDK would wrap stdin in a TextIOWrapper with errors="replace" (mcp/server/stdio.py), serving a
    line whose strings held invalid UTF-8 as U+FFFD; its parser (pydantic) takes bytes and checks UTF-8 itself.
    Answered here, since the SDK would put a bad line into the read stream as its exception, which the server's
    dispatcher drops with a debug log (mcp/shared/jsonrpc_dispatcher.py, `_dispatch`; server.run sets no
    `on_stream_exception`), and the exception no longer has the line's id."""

    def __init__(self, lines) -> None:
        self._lines = lines
        self._replies = None
        self._ready = anyio.Event()  # set once stdio_server() has made the write stream, which answers go to

    def answer_to(self, write_stream) -> None:
        self._replies = write_stream
        self._ready.set()

    async def __aiter__(self):
        async for line in self._lines:
            if (error := rejection(line)) is None:
                yield line
                continue
            logging.getLogger(__name__).warning("a line on stdin got error %s: %s", error.error.code,
                                                error.error.message)
            await self._ready.wait()
            try:
                await self._replies.send(SessionMessage(error))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return  # the server has stopped writing: nothing more to read for


def _sandbox_missing(settings: Settings) -> list[str]:
    """What of the workers' sandbox this host refuses (a trial sandbox, entered by a child of this process)."""
    if not settings.worker_sandbox:
        return ["the sandbox is off (KFORGE_WORKER_SANDBOX=0)"]
    from kforge.tools.process.sandbox import Confinement, trial

    from .settings import secret_files

    return trial(Confinement(home=str(settings.home), hidden=secret_files(settings),
                             isolate_network=settings.worker_network == "isolated"))["missing"]


def _refuse(message: str) -> int:
    print(f"kforge: {message}", file=sys.stderr)
    return 2


def _doctor(args: argparse.Namespace, settings: Settings) -> int:
    from .settings import tool_context

    tools = tool_context(settings)

    async def gather() -> tuple[list, dict]:
        found = await tools.availability()
        facts = {}
        if args.measure:  # ceilings: measured once per device, then read from the cache
            for a in found:
                if a.ok and a.timing:
                    # each GPU of the host, side by side (one worker per GPU); the first stands for the backend
                    each = placements(a) or [None]
                    measured = {}

                    async def measure(i: int, placement: Placement | None, backend: str = a.backend) -> None:
                        measured[i] = await tools.device_facts(backend, remeasure=args.remeasure, placement=placement)

                    async with anyio.create_task_group() as tg:
                        for i, placement in enumerate(each):
                            tg.start_soon(measure, i, placement)
                    facts[a.backend] = measured[0]
        return [tools.measured_gpus(a) for a in found], facts

    found, facts = anyio.run(gather)
    disk = disk_usage(settings.home)
    if args.json:
        print(json.dumps({"kforge": __version__, "home": str(settings.home), "worker_network": tools.worker_network,
                          "worker_sandbox": tools.worker_isolation,
                          "backends": [a.model_dump(mode="json") for a in found],
                          "devices": {k: v.model_dump(mode="json") for k, v in facts.items()},
                          "disk": {"total_bytes": disk.total_bytes, "store_bytes": disk.store_bytes,
                                   "cache_bytes": disk.cache_bytes, "caches": disk.caches,
                                   "cache_max_bytes": int(settings.cache_max_gb * 1e9) or None}}, indent=1))
        return 0 if any(a.ok for a in found) else 1
    print(f"kforge {__version__}; data directory {settings.home}")
    print(f"workers: network {tools.worker_network}")
    sandbox = tools.worker_isolation
    print(f"workers: sandbox {', '.join(sandbox.get('applied', [])) or 'none'}")
    for piece in sandbox.get("missing", []):
        print(f"-- sandbox missing: {piece}")
    for a in found:
        mark = "ok " if a.ok else "-- "
        print(f"{mark} {a.backend:8s} {a.reason}" + (f" [{a.device_name}]" if a.device_name else ""))
        for tool, version in a.versions.items():
            print(f"       {tool}: {version}")
        if a.backend in facts:
            f = facts[a.backend]
            rates = ", ".join(f"{dtype} {rate:g} TFLOP/s" for dtype, rate in f.peak_tflops.items())
            print(f"       measured ceilings: copy {f.peak_bandwidth_gbs:g} GB/s; matmul {rates}")
        for gpu in a.gpus:
            print(f"       {describe_gpu(gpu)}")
    cap = f"cap {settings.cache_max_gb:g} GB (KFORGE_CACHE_MAX_GB)" if settings.cache_max_gb else "no cap"
    parts = ", ".join(f"{name} {format_bytes(n)}" for name, n in disk.caches.items() if n)
    print(f"disk: {format_bytes(disk.total_bytes)} in {settings.home}: store {format_bytes(disk.store_bytes)}; "
          f"caches {format_bytes(disk.cache_bytes)}{f' ({parts})' if parts else ''}, {cap}; `kforge prune` trims them")
    if settings.kernelbench_dir:
        print(f"KernelBench problems from {settings.kernelbench_dir}")
    print("next: `kforge config claude-desktop` (or claude-code, vscode, cursor) prints a client configuration")
    return 0 if any(a.ok for a in found) else 1


def _config(args: argparse.Namespace, settings: Settings) -> int:
    print(client_config(args.client, settings_environment()))
    print(f"kforge: {where_it_goes(args.client)}", file=sys.stderr)
    return 0


def _prune(args: argparse.Namespace, settings: Settings) -> int:
    if args.all:
        limit = None
    elif args.max_gb is not None:
        limit = int(args.max_gb * 1e9)
    elif settings.cache_max_gb:
        limit = int(settings.cache_max_gb * 1e9)
    else:
        return _refuse("no cap to prune to: KFORGE_CACHE_MAX_GB is 0; give --max-gb N or --all")
    print(prune_caches(settings.home, max_bytes=limit))
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line's parser: every command and option with its help."""
    parser = argparse.ArgumentParser(prog="kforge", description="KForge: an MCP server for kernel generation agents.",
                                     epilog=f"Settings: KFORGE_* environment variables, or {config_file()} "
                                            "(README: Commands and configuration).")
    parser.add_argument("--version", action="version", version=f"kforge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve MCP (stdio by default, for desktop clients)")
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                       help="stdio (default): for a client that starts the server itself (Claude Desktop, IDEs); "
                            "http: streamable HTTP at /mcp, for remote or several clients")
    serve.add_argument("--host", default="127.0.0.1",
                       help="HTTP: address to bind (default 127.0.0.1; any other needs KFORGE_TOKEN)")
    serve.add_argument("--port", type=int, default=8765, help="HTTP: port (default 8765)")
    serve.add_argument("--token-file", type=Path, help="HTTP: file holding the bearer token (mode 600), "
                       "instead of KFORGE_TOKEN")
    serve.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                       help="HTTP: a Host name clients use to reach this server (the public name behind a proxy); repeatable")
    serve.add_argument("--certfile", type=Path, help="HTTP: TLS certificate (PEM), to serve HTTPS")
    serve.add_argument("--keyfile", type=Path, help="HTTP: TLS private key (PEM)")
    serve.add_argument("--allow-partial-sandbox", action="store_true", default=None,
                       help="HTTP: serve even where the host refuses part of the workers' sandbox (README: Security)")
    serve.add_argument("--ray", metavar="ADDRESS", help="run compile, verify and profile jobs on a Ray cluster: 'auto' "
                       "(the cluster this host joined with `ray start`) or the head's HOST:PORT; needs "
                       "pip install 'kforge[ray]' (README: Fleet (Ray))")
    doctor = sub.add_parser("doctor", help="say which backends this host offers and why others are missing")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--no-measure", dest="measure", action="store_false",
                        help="skip the device ceilings (copy bandwidth, matmul rates; measured once per device)")
    doctor.add_argument("--remeasure", action="store_true", help="measure the ceilings again instead of reading the cache")
    config = sub.add_parser("config", help="print an MCP client's configuration that starts this install's server")
    config.add_argument("client", choices=CLIENTS, help="claude-desktop, cursor: their JSON config; claude-code: the "
                        "`claude mcp add` command; mcp-json: a project's .mcp.json (Claude Code); vscode: .vscode/mcp.json")
    prune = sub.add_parser("prune", help="delete the least recently used build caches (precompiled headers, builds, "
                           "compiler caches); results and profiles are kept")
    prune.add_argument("--max-gb", type=float, metavar="GB", help="prune to this size (default: KFORGE_CACHE_MAX_GB)")
    prune.add_argument("--all", action="store_true", help="remove every cache entry not used in the last 10 minutes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    overrides = {k: v for k in ("token_file", "certfile", "keyfile", "allow_partial_sandbox", "ray")
                 if (v := getattr(args, k, None)) is not None}
    if getattr(args, "allowed_host", None):
        overrides["allowed_hosts"] = args.allowed_host
    flags = {"token_file": "--token-file", "certfile": "--certfile", "keyfile": "--keyfile", "allowed_hosts": "--allowed-host",
             "allow_partial_sandbox": "--allow-partial-sandbox", "ray": "--ray"}
    try:
        settings = load_settings(flags=flags, **overrides)
        analyst_config(settings)  # a misconfigured analyst stops here, with what to set
    except ValueError as exc:  # ConfigError, and the analyst's
        print(f"kforge: configuration error: {exc}", file=sys.stderr)
        return 2
    handler = {"serve": _serve, "doctor": _doctor, "config": _config, "prune": _prune}[args.command]
    return handler(args, settings)


if __name__ == "__main__":
    sys.exit(main())
