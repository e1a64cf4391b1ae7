"""The MCP surface: the server app (tools, resources, prompts), transports, auth, settings and the `kforge`
command line. Its surface is its modules; nothing is imported here.
"""

__all__ = ["app", "auth", "catalog", "cli", "clients", "compact", "http", "jsonrpc_errors", "kernelbench", "pictures",
           "prewarm", "settings", "tool_params"]
