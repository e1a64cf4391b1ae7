"""ATTACK: read the host's password hashes, /etc/shadow (and /etc/gshadow).
MUST: each read fails or returns nothing (covered by an empty file, or refused); no content is reported."""
import errno
import json


def read(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"
    lines = data.count(b"\n")
    return f"SUCCEEDED: {len(data)} bytes, {lines} lines" if data else "empty"


raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps({p: read(p) for p in ("/etc/shadow", "/etc/gshadow")}))
