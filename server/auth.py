"""Bearer-token access for HTTP: one pre-shared token, through the SDK's own auth middleware.

The token comes from ``KFORGE_TOKEN`` or a token file, never from the config file or the command line
(both end up in shell histories and process lists). It is compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import stat
from pathlib import Path
from typing import Any

from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.settings import AuthSettings
from pydantic import SecretStr

__all__ = ["MAKE_TOKEN", "MIN_TOKEN_CHARS", "StaticTokenVerifier", "TokenError", "auth_arguments", "load_token"]

MIN_TOKEN_CHARS = 32
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


class TokenError(ValueError):
    """The token is missing, unreadable or too weak; the message says what to do."""


class StaticTokenVerifier(TokenVerifier):
    def __init__(self, expected: str) -> None:
        self._expected = expected.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        if hmac.compare_digest(token.encode(), self._expected):  # constant time
            return AccessToken(token=token, client_id="kforge-client", scopes=["kforge"])
        return None  # the SDK answers 401 with WWW-Authenticate: Bearer error="invalid_token"


def load_token(from_environment: SecretStr | None, token_file: Path | None) -> tuple[str | None, str]:
    """The token and where it came from: ``KFORGE_TOKEN`` (the settings' `token`), else `token_file`; (None, "")
    when neither."""
    token = from_environment.get_secret_value() if from_environment is not None else None
    source = "KFORGE_TOKEN"
    if not token and token_file is not None:
        try:
            info = token_file.stat()
            token, source = token_file.read_text().strip(), str(token_file)
        except OSError as exc:
            raise TokenError(f"cannot read the token file {token_file}: {exc.strerror}") from None
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TokenError(f"the token file {token_file} is readable by other users: chmod 600 {token_file}")
    if not token:
        return None, ""
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(f"the token from {source} has {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
                         f"random ones: {MAKE_TOKEN}")
    return token, source


def auth_arguments(token: str | None) -> dict[str, Any]:
    """`MCPServer` arguments that require `token` on every HTTP request (none without a token)."""
    if token is None:
        return {}
    # issuer_url is required by AuthSettings but only used for OAuth metadata, which is not published
    # (resource_server_url=None): this is a static-token resource server, not an OAuth one.
    return {"token_verifier": StaticTokenVerifier(token),
            "auth": AuthSettings(issuer_url="https://auth.invalid", resource_server_url=None, required_scopes=["kforge"])}
