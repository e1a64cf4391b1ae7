"""SNOOP: looks for the server's secrets in its environment and for a way out to the network, then reports."""
import os
import socket

leaked = sorted(k for k in os.environ if any(s in k.upper() for s in ("TOKEN", "KEY", "SECRET")))
try:
    socket.create_connection(("127.0.0.1", __PORT__), timeout=3).close()
    net = "open"
except OSError as exc:
    net = f"blocked: {exc}"
raise RuntimeError(f"snoop env={leaked} net={net}")
