"""ATTACK: read the server's secrets from their files (the paths are given, as an attacker would guess or
learn them): the bearer-token file and the TLS private key.
MUST: each read fails or returns nothing (the files are masked); no secret reaches the report (only a length
and a short digest say whether it was read)."""
import errno
import hashlib
import json


def read(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"
    if not data.strip():
        return "empty"
    return f"SUCCEEDED: {len(data)} bytes, sha256 {hashlib.sha256(data.strip()).hexdigest()[:12]}"


raise RuntimeError("SANDBOX-REPORT __MARKER__ " + json.dumps({"token": read("__TOKEN_FILE__"),
                                                                "tls_key": read("__KEY_FILE__")}))
