"""MCP client configurations that start this install's `kforge serve`: `kforge config <client>`.

Each client has its own format (checked against its documentation):

- Claude Desktop, ``claude_desktop_config.json``: ``{"mcpServers": {name: {"command", "args", "env"}}}``.
- Claude Code: ``claude mcp add --transport stdio [--scope S] [--env K=V] name -- command args...`` (options
  before the name, the server's command after ``--``), or a project's ``.mcp.json``:
  ``{"mcpServers": {name: {"type": "stdio", "command", "args", "env"}}}``.
- VS Code, ``.vscode/mcp.json`` or the user profile's ``mcp.json``: ``{"servers": {name: {"type": "stdio", ...}}}``.
- Cursor, ``~/.cursor/mcp.json`` or a project's ``.cursor/mcp.json``: ``{"mcpServers": {name: {"command", ...}}}``.

Desktop clients start servers without the shell's environment (and often without its PATH), so the
command is an absolute path and the KFORGE_* settings in effect here travel in ``env``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

__all__ = ["CLIENTS", "client_config", "serve_command", "where_it_goes"]

CLIENTS = ("claude-desktop", "claude-code", "mcp-json", "vscode", "cursor")
_NAME = "kforge"


def serve_command() -> list[str]:
    """This install's `kforge serve` as absolute paths: the console script beside this Python, else `python -m`."""
    python = Path(sys.executable).absolute()  # not resolved: a venv's python is a link out of the venv
    script = python.parent / ("kforge.exe" if os.name == "nt" else "kforge")
    if script.is_file():
        return [str(script), "serve"]
    return [str(python), "-m", "kforge.server.cli", "serve"]


def client_config(client: str, env: dict[str, str]) -> str:
    """The text to give `client` so that it starts this install's server over stdio.

    Args:
        client: one of CLIENTS.
        env: the KFORGE_* variables to carry over (`kforge.server.settings.settings_environment`: the settings in
            effect here, never the token: secrets stay out of config files).
    """
    command, *args = serve_command()
    if client == "claude-code":
        words = ["claude", "mcp", "add", "--transport", "stdio", "--scope", "user"]
        for k, v in env.items():
            words += ["--env", f"{k}={v}"]
        return shlex.join([*words, _NAME, "--", command, *args])
    entry: dict[str, object] = {"command": command, "args": args}
    if client in ("mcp-json", "vscode"):
        entry = {"type": "stdio", **entry}
    if env:
        entry["env"] = env
    if client in ("claude-desktop", "cursor", "mcp-json"):
        return json.dumps({"mcpServers": {_NAME: entry}}, indent=2)
    if client == "vscode":
        return json.dumps({"servers": {_NAME: entry}}, indent=2)
    raise ValueError(f"unknown client {client!r}; one of: {', '.join(CLIENTS)}")


def where_it_goes(client: str) -> str:
    """Where the printed configuration goes, for a note on stderr."""
    return {
        "claude-desktop": "merge into claude_desktop_config.json (Settings > Developer > Edit Config; macOS: "
                          "~/Library/Application Support/Claude/, Windows: %APPDATA%\\Claude\\), then restart Claude Desktop",
        "claude-code": "run this command (--scope user: every project; --scope project writes .mcp.json, "
                       "see `kforge config mcp-json`); `claude mcp list` shows it",
        "mcp-json": "merge into .mcp.json at your project's root (Claude Code, project scope)",
        "vscode": "merge into .vscode/mcp.json in your workspace (or MCP: Open User Configuration)",
        "cursor": "merge into ~/.cursor/mcp.json (every project) or .cursor/mcp.json in a project",
    }[client]
