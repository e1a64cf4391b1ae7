"""HANG with a child: starts a `sleep` process whose argument carries __TAG__ (so the test finds it, and its
parent the worker, from outside the worker's PID namespace), then spins at import."""
import subprocess

child = subprocess.Popen(["sleep", "600.__TAG__"])
while True:
    pass
