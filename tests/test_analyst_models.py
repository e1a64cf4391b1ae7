"""Model analysts: the HTTP APIs against a loopback server that speaks each one, MCP sampling through
the SDK's own client, screenshots, and the fallback to the rules when a model fails."""

from __future__ import annotations

import base64
import json
import os
import struct
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mcp import Client
from mcp.types import CreateMessageResult, TextContent

from kforge.profilers.analyst.http import ModelConfig
from kforge.server.app import build_server
from kforge.server.settings import Settings
from kforge.tools.context import ToolContext
from kforge.tools.tool_inputs import RequestError
from kforge.tools.summarize import CONFIGURE_VISION, AnalystConfig, summarize_profile

from .conftest import free_port

pytestmark = pytest.mark.anyio

CAPTURE = Path(__file__).parent / "data" / "known_bottlenecks" / "uncoalesced_transpose"
NCU_TEXT = (CAPTURE / "ncu_details.txt").read_text()
SECRET = "sk-test-never-shown-0123456789"

GOOD_ANSWER = {
    "bottleneck": "memory-bound",
    "bottleneck_why": "32 sectors per request: the loads are strided",
    "evidence": [{"metric": "Global Load Sectors Per Request", "value": 32, "judged_against": "4 when coalesced",
                  "source": "screenshot"}],
    "recommendations": [{"title": "Transpose through a shared-memory tile", "action": "Load a 32x33 tile coalesced, "
                         "sync, write it transposed", "where": "line 12", "why": "coalesced reads",
                         "expected_effect": "about 2.5x", "confidence": "High"}],
    "notes": [],
}


def png() -> str:
    """A valid 1x1 PNG, base64."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b"")
    return base64.b64encode(raw).decode()


class FakeModelServer:
    """Loopback server for both APIs: records each request, answers with `reply` (text) or `status`."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict, dict]] = []
        self.reply = "```json\n" + json.dumps(GOOD_ANSWER) + "\n```"
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                if outer.status != 200:
                    self.send_response(outer.status)
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "overloaded"}}')
                    return
                if self.path == "/v1/messages":
                    data = {"type": "message", "content": [{"type": "text", "text": outer.reply}]}
                else:
                    data = {"choices": [{"message": {"role": "assistant", "content": outer.reply}}]}
                payload = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture
def model_server():
    server = FakeModelServer()
    yield server
    server.close()


@pytest.fixture
def ctx(tmp_path) -> ToolContext:
    return ToolContext(home=tmp_path)


def config(api: str, base_url: str, **kw) -> AnalystConfig:
    return AnalystConfig(provider=api, model=ModelConfig(api=api, model="test-model", base_url=base_url,  # type: ignore[arg-type]
                                                         api_key_env="KFORGE_TEST_KEY", timeout_s=10,
                                                         api_key=os.environ.get("KFORGE_TEST_KEY"), **kw))


async def test_anthropic_gets_metrics_rules_text_and_image(ctx, model_server, monkeypatch):
    monkeypatch.setenv("KFORGE_TEST_KEY", SECRET)
    result = await summarize_profile(ctx, analyst=config("anthropic", model_server.url), profile_text=NCU_TEXT,
                                     screenshots=[png()])
    path, headers, body = model_server.requests[-1]
    assert path == "/v1/messages" and headers["x-api-key"] == SECRET and headers["anthropic-version"]
    blocks = body["messages"][0]["content"]
    assert blocks[0]["type"] == "image" and blocks[0]["source"]["media_type"] == "image/png"
    text = blocks[-1]["text"]
    assert "The rules engine's findings" in text and "uncoalesced" in text  # the rules' diagnosis travels along
    assert '"collector": "ncu"' in text and "transpose_naive" in text        # normalized metrics and raw text
    assert "exactly one JSON object" in body["system"]
    analysis = result.analysis
    assert analysis.provider == "anthropic:test-model" and analysis.bottleneck == "memory-bound"
    assert analysis.recommendations[0].title == "Transpose through a shared-memory tile"
    assert analysis.recommendations[0].confidence == "high"
    assert SECRET not in result.model_dump_json()


async def test_openai_compatible_sends_data_url_images_and_no_key_when_none(ctx, model_server, monkeypatch):
    monkeypatch.delenv("KFORGE_TEST_KEY", raising=False)
    result = await summarize_profile(ctx, analyst=config("openai", model_server.url + "/v1"), screenshots=[png()])
    path, headers, body = model_server.requests[-1]
    assert path == "/v1/chat/completions" and "authorization" not in headers  # a local server needs no key
    user = body["messages"][1]["content"]
    assert body["messages"][0]["role"] == "system"
    assert user[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert result.source == "screenshots" and result.analysis.provider == "openai:test-model"


async def test_model_without_vision_gets_no_images(ctx, model_server):
    await summarize_profile(ctx, analyst=config("openai", model_server.url, vision=False), profile_text=NCU_TEXT,
                            screenshots=[png()])
    user = model_server.requests[-1][2]["messages"][1]["content"]
    assert [part["type"] for part in user] == ["text"]


@pytest.mark.parametrize("failure, words", [
    ("garbage", "its answer was unusable (the answer holds no JSON object)"),
    ("no recommendations", "its answer was unusable (the answer does not fit the schema"),
    ("http 529", "answered HTTP 529"),
])
async def test_bad_model_answers_fall_back_to_the_rules(ctx, model_server, failure, words):
    if failure == "garbage":
        model_server.reply = "I think it is memory bound, probably."
    elif failure == "no recommendations":
        model_server.reply = json.dumps({**GOOD_ANSWER, "recommendations": []})
    else:
        model_server.status = 529
    result = await summarize_profile(ctx, analyst=config("openai", model_server.url), profile_text=NCU_TEXT)
    analysis = result.analysis
    assert analysis.provider == "rules" and analysis.bottleneck == "memory-bound"
    assert analysis.recommendations[0].title == "Coalesce the hot kernel's global accesses"
    assert words in analysis.notes[0] and "openai:test-model analyst was not used" in analysis.notes[0]


async def test_unreachable_model_and_missing_key_fall_back(ctx, monkeypatch):
    dead = f"http://127.0.0.1:{free_port()}"
    result = await summarize_profile(ctx, analyst=config("openai", dead), profile_text=NCU_TEXT)
    assert result.analysis.provider == "rules" and "unreachable" in result.analysis.notes[0]
    monkeypatch.delenv("KFORGE_TEST_KEY", raising=False)
    result = await summarize_profile(ctx, analyst=config("anthropic", dead), profile_text=NCU_TEXT)
    assert "KFORGE_TEST_KEY is not set" in result.analysis.notes[0]


async def test_screenshots_without_a_vision_analyst_say_what_to_configure(ctx, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)  # no tesseract: no OCR either
    with pytest.raises(RequestError) as err:
        await summarize_profile(ctx, screenshots=[png()])
    assert str(err.value) == CONFIGURE_VISION and "KFORGE_ANALYST=anthropic" in CONFIGURE_VISION
    with_text = await summarize_profile(ctx, profile_text=NCU_TEXT, screenshots=[png()])
    assert with_text.analysis.provider == "rules"
    assert any(n.startswith("the screenshots were not read") for n in with_text.analysis.notes)
    with pytest.raises(RequestError, match="screenshot 1 is neither PNG nor JPEG"):
        await summarize_profile(ctx, profile_text=NCU_TEXT, screenshots=[base64.b64encode(b"GIF89a....").decode()])


def _sampling_server(tmp_path):
    return build_server(Settings(home=tmp_path, analyst="sampling"))


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_sampling_asks_the_clients_model_with_the_screenshot(tmp_path, mode):
    seen: list[list[str]] = []

    async def client_model(context, params) -> CreateMessageResult:
        seen.append([block.type for m in params.messages for block in m.content_as_list])
        assert "exactly one JSON object" in params.system_prompt
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text=json.dumps(GOOD_ANSWER)),
                                   model="client-model")

    async with Client(_sampling_server(tmp_path), mode=mode, sampling_callback=client_model) as client:
        result = await client.call_tool("summarize_profile", {"profile_text": NCU_TEXT, "screenshots": [png()]})
    assert not result.is_error, result.content[0].text
    analysis = result.structured_content["analysis"]
    assert analysis["provider"] == "sampling:client-model"
    assert analysis["recommendations"][0]["title"] == "Transpose through a shared-memory tile"
    assert seen and seen[-1] == ["text", "image"]


async def test_sampling_without_client_support_falls_back_to_rules(tmp_path):
    async with Client(_sampling_server(tmp_path)) as client:  # no sampling_callback: no sampling capability
        result = await client.call_tool("summarize_profile", {"profile_text": NCU_TEXT})
    analysis = result.structured_content["analysis"]
    assert analysis["provider"] == "rules" and "this client offers no sampling" in analysis["notes"][0]


def test_analyst_from_config_file_with_environment_winning(tmp_path, monkeypatch):
    from kforge.server.settings import analyst_config

    config_path = tmp_path / "config.toml"
    config_path.write_text('analyst = "openai"\nanalyst_model = "llava"\nanalyst_base_url = "http://localhost:11434/v1"\n')
    monkeypatch.setenv("KFORGE_CONFIG", str(config_path))
    cfg = analyst_config(Settings())
    assert cfg.provider == "openai" and cfg.model and cfg.model.label == "openai:llava"
    assert cfg.model.base_url == "http://localhost:11434/v1"
    monkeypatch.setenv("KFORGE_ANALYST", "rules")
    assert analyst_config(Settings()).provider == "rules"
    monkeypatch.setenv("KFORGE_ANALYST", "anthropic")
    monkeypatch.delenv("KFORGE_CONFIG")
    with pytest.raises(ValueError, match="needs KFORGE_ANALYST_MODEL"):
        analyst_config(Settings())


def test_the_settings_read_the_analysts_key_from_the_variable_they_name(monkeypatch):
    """The settings are the one reader of the environment: the key is read there and passed down, and it does not
    show in the config's repr (logs, errors)."""
    from kforge.server.settings import analyst_config

    monkeypatch.setenv("KFORGE_ANALYST", "anthropic")
    monkeypatch.setenv("KFORGE_ANALYST_MODEL", "m")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-default")
    monkeypatch.setenv("KFORGE_TEST_KEY", SECRET)
    assert analyst_config(Settings()).model.key() == "sk-default"
    monkeypatch.setenv("KFORGE_ANALYST_API_KEY_ENV", "KFORGE_TEST_KEY")
    model = analyst_config(Settings()).model
    assert model.key() == SECRET and model.key_env == "KFORGE_TEST_KEY" and SECRET not in repr(model)
    monkeypatch.delenv("KFORGE_TEST_KEY")
    assert analyst_config(Settings()).model.key() is None


VTUNE_TEXT = """Function                     CPU Time  Clocks   Instructions Retired  CPI Rate  Memory Bound
fused_relu_scale_bias        1.250s    4.1e9    2.0e9                 2.05      71.3%
"""


async def test_other_profilers_text_goes_to_a_model_and_is_refused_by_the_rules(ctx, model_server):
    result = await summarize_profile(ctx, analyst=config("openai", model_server.url), profile_text=VTUNE_TEXT)
    assert result.source == "text" and result.analysis.provider == "openai:test-model"
    assert "CPI Rate" in model_server.requests[-1][2]["messages"][1]["content"][0]["text"]
    with pytest.raises(RequestError, match="configure a model analyst"):
        await summarize_profile(ctx, profile_text=VTUNE_TEXT)
