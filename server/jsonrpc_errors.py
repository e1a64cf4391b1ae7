"""The one verdict on a message the server cannot take (issue 17), shared by stdio (cli.py) and HTTP (http.py).

Both transports hand it the message's raw bytes, before the SDK decodes them: the SDK's stdio transport would
decode stdin with errors="replace" and serve a message whose strings held invalid UTF-8 (as U+FFFD), and its
legacy HTTP path answers valid JSON that is no JSON-RPC message with -32602 and a pydantic dump quoting the body.
JSON-RPC 2.0 wants -32700 (no JSON) or -32600 (JSON, but no request), with the request's id where one could be
read, and here a short message that names the first problem without echoing the body."""

from __future__ import annotations

import pydantic_core
from mcp.types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError, JSONRPCNotification, jsonrpc_message_adapter
from pydantic import ValidationError

__all__ = ["rejection"]

# Which member of the SDK's JSONRPCMessage union a bad object was most likely meant as, by the key that tells them
# apart, so that the message names that member's first problem (`{"jsonrpc":"2.0"}` lacks a method, not an id).
_MEANT_AS = (("result", "JSONRPCResponse"), ("error", "JSONRPCError"), ("id", "JSONRPCRequest"))


def rejection(raw: bytes) -> JSONRPCError | None:
    """None if the SDK takes `raw` as a JSON-RPC message, else the error to answer it with.

    Parsed exactly as the SDK parses (its adapter, from bytes), so that what passes here passes there; pydantic
    parses bytes strictly, so invalid UTF-8 anywhere, even inside a string, is a parse error."""
    try:
        parsed = jsonrpc_message_adapter.validate_json(raw, by_name=False)
        return _request_with_a_bad_id(raw) if isinstance(parsed, JSONRPCNotification) else None
    except ValidationError as exc:
        problems = exc.errors(include_url=False, include_context=False, include_input=False)
    except Exception as exc:  # noqa: BLE001 - whatever else the parser raises, the sender gets an answer
        return _error(None, PARSE_ERROR, f"Parse error: {type(exc).__name__}")
    if not problems or any(p["type"] in ("json_invalid", "string_unicode") for p in problems):
        return _error(None, PARSE_ERROR, f"Parse error: {problems[0]['msg'] if problems else 'invalid JSON'}")
    message = pydantic_core.from_json(raw)  # valid JSON: only its shape was refused
    meant = (next((kind for key, kind in _MEANT_AS if key in message), "JSONRPCNotification")
             if isinstance(message, dict) else None)
    first = next((p for p in problems if p["loc"][:1] == (meant,)), problems[0])
    where = ".".join(str(part) for part in first["loc"][1:])  # loc[0] is the union member, no part of the message
    reason = f"{where}: {first['msg']}" if where else first["msg"]
    return _error(_usable_id(message), INVALID_REQUEST, f"Invalid Request: not a JSON-RPC 2.0 message ({reason})")


def _request_with_a_bad_id(raw: bytes) -> JSONRPCError | None:
    """A method call whose `id` is there but no string or integer (true, null, 1.5, a list): the SDK's union takes
    it for a notification, drops the id and never answers, so its sender would wait forever. MCP wants a string or
    an integer id on every request. Only notifications are parsed again here, and they are few."""
    message = pydantic_core.from_json(raw)
    if not isinstance(message, dict) or "id" not in message:
        return None
    return _error(None, INVALID_REQUEST, f"Invalid Request: id must be a string or an integer, not "
                                         f"{type(message['id']).__name__ if message['id'] is not None else 'null'}")


def _usable_id(message: object) -> str | int | None:
    """The message's id where JSON-RPC allows one (a string or an integer; bool is no integer here), else None."""
    rid = message.get("id") if isinstance(message, dict) else None
    return rid if type(rid) in (str, int) else None


def _error(rid: str | int | None, code: int, message: str) -> JSONRPCError:
    return JSONRPCError(jsonrpc="2.0", id=rid, error=ErrorData(code=code, message=message[:200]))
