"""HANG with a child: starts a `sleep` process, records both pids in __PIDFILE__, then spins at import."""
import os
import subprocess

child = subprocess.Popen(["sleep", "600"])
with open("__PIDFILE__", "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
while True:
    pass
