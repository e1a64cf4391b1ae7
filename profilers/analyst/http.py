"""Model analysts over HTTP: the Anthropic Messages API and the OpenAI-compatible chat API.

The OpenAI-compatible API also covers local servers (vLLM, Ollama, llama.cpp's server) through
`base_url`. Keys come from the server's environment (the variable named in `ModelConfig.api_key_env`), read by
the server's settings like every other setting (`kforge.server.settings.analyst_config`), are sent only in the
request header, and never appear in results or errors; candidate workers get a
scrubbed environment (tools/process/runner.py), so they never see them either. Requests use the standard
library in a worker thread: one blocking POST, no extra dependency.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio.to_thread

from .model import AnalystRequest

__all__ = ["ModelConfig", "ModelError", "ask_model"]

_DEFAULT_BASE = {"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com/v1"}
_DEFAULT_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
_ANTHROPIC_VERSION = "2023-06-01"
_ERROR_BODY_CHARS = 300


class ModelError(Exception):
    """The model could not be asked or answered with an error; the message is safe to show."""


@dataclass(frozen=True)
class ModelConfig:
    api: Literal["anthropic", "openai"]
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 60.0
    max_tokens: int = 2000
    vision: bool = True
    api_key: str | None = field(default=None, repr=False)  # the value of `key_env`, read by the server's settings

    @property
    def label(self) -> str:
        return f"{self.api}:{self.model}"

    @property
    def key_env(self) -> str:
        """The environment variable that holds the API key (named where it is missing)."""
        return self.api_key_env or _DEFAULT_KEY_ENV[self.api]

    def key(self) -> str | None:
        return self.api_key or None


def _anthropic(cfg: ModelConfig, req: AnalystRequest, key: str | None) -> tuple[str, dict[str, str], dict[str, Any]]:
    if key is None:
        raise ModelError(f"{cfg.key_env} is not set")
    content: list[dict[str, Any]] = [{"type": "image", "source": {"type": "base64", "media_type": im.mime_type,
                                                                   "data": im.data}} for im in req.images]
    content.append({"type": "text", "text": req.user})
    body = {"model": cfg.model, "max_tokens": cfg.max_tokens, "temperature": 0, "system": req.system,
            "messages": [{"role": "user", "content": content}]}
    headers = {"x-api-key": key, "anthropic-version": _ANTHROPIC_VERSION}
    return (cfg.base_url or _DEFAULT_BASE["anthropic"]).rstrip("/") + "/v1/messages", headers, body


def _openai(cfg: ModelConfig, req: AnalystRequest, key: str | None) -> tuple[str, dict[str, str], dict[str, Any]]:
    content: list[dict[str, Any]] = [{"type": "text", "text": req.user}]
    content += [{"type": "image_url", "image_url": {"url": f"data:{im.mime_type};base64,{im.data}"}} for im in req.images]
    body = {"model": cfg.model, "max_tokens": cfg.max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": req.system}, {"role": "user", "content": content}]}
    headers = {"Authorization": f"Bearer {key}"} if key else {}  # local servers take none
    return (cfg.base_url or _DEFAULT_BASE["openai"]).rstrip("/") + "/chat/completions", headers, body


def _reply_text(api: str, data: dict[str, Any]) -> str:
    try:
        if api == "anthropic":
            return "".join(block.get("text", "") for block in data["content"] if block.get("type") == "text")
        message = data["choices"][0]["message"]["content"]
        return message if isinstance(message, str) else "".join(p.get("text", "") for p in message)
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ModelError(f"the {api} response has no answer text") from None


def _post(url: str, headers: dict[str, str], body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - configured URL
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:_ERROR_BODY_CHARS].decode(errors="replace")
        raise ModelError(f"{url} answered HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise ModelError(f"{url} unreachable: {getattr(exc, 'reason', exc)}") from None
    except json.JSONDecodeError:
        raise ModelError(f"{url} answered with something that is not JSON") from None


async def ask_model(cfg: ModelConfig, req: AnalystRequest) -> str:
    """The model's reply text; ModelError when it cannot be had."""
    build = _anthropic if cfg.api == "anthropic" else _openai
    if req.images and not cfg.vision:
        req = AnalystRequest(system=req.system, user=req.user)
    url, headers, body = build(cfg, req, cfg.key())
    data = await anyio.to_thread.run_sync(_post, url, headers, body, cfg.timeout_s)
    return _reply_text(cfg.api, data)
