"""Server configuration, read once by the command line: environment (``KFORGE_*``) over a TOML file.

The file is ``$KFORGE_CONFIG`` or ``<user config dir>/kforge/config.toml`` (e.g. ~/.config/kforge/config.toml),
with the same names in lower case and without the prefix (``analyst = "openai"``). Secrets (API keys,
the server token) are read from the environment only, never from this file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from kforge.profilers.analyst.http import ModelConfig
from kforge.tools.context import ToolContext
from kforge.tools.runner import WorkerLimits
from kforge.tools.summarize import AnalystConfig

__all__ = ["Settings", "analyst_config", "config_file", "tool_context"]


def config_file() -> Path:
    return Path(os.environ.get("KFORGE_CONFIG") or Path(platformdirs.user_config_dir("kforge")) / "config.toml")


def _default_memory_mb() -> int:
    """Half the machine's memory: one runaway candidate must not take the host down."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 / 2**20)
    except (ValueError, OSError):
        return 8192


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KFORGE_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path(platformdirs.user_data_dir("kforge")),
                       description="Data directory: result store, artifacts, build caches (KFORGE_HOME).")
    worker_timeout_s: float = Field(default=600.0, gt=0, description="Deadline for one worker step (a build, a timing run).")
    worker_memory_mb: int | None = Field(default_factory=_default_memory_mb,
                                         description="Address-space limit per CPU worker; 0 disables it.")
    keep_scratch: bool = Field(default=False, description="Keep each job's scratch directory for debugging.")
    analyst: Literal["rules", "anthropic", "openai", "sampling"] = Field(
        default="rules", description="Who analyses profiles in summarize_profile: the built-in rules (offline), a model "
        "over the Anthropic Messages API or an OpenAI-compatible API (vLLM, Ollama, llama.cpp too), or the client's "
        "own model through MCP sampling. Model analysts fall back to the rules when they fail.")
    analyst_model: str | None = Field(default=None, description="Model name for 'anthropic' or 'openai'.")
    analyst_base_url: str | None = Field(default=None, description="API base URL, e.g. http://localhost:11434/v1 for Ollama.")
    analyst_api_key_env: str | None = Field(default=None, description="Environment variable holding the API key "
                                            "(default ANTHROPIC_API_KEY or OPENAI_API_KEY).")
    analyst_timeout_s: float = Field(default=60.0, gt=0, description="Deadline of one model request.")
    analyst_vision: bool = Field(default=True, description="Whether the model reads images (screenshots).")
    timing_budget_s: float = Field(default=1.0, gt=0, le=60, description="Default time budget per timed model.")
    worker_network: Literal["isolated", "host"] = Field(
        default="isolated", description="Workers start in a network namespace of their own (no network), where the "
        "OS allows it; 'host' leaves them on the host's network.")
    worker_file_mb: int | None = Field(default=16384, description="Largest file a worker may write (RLIMIT_FSIZE); 0 disables it.")
    # Jobs: desktop clients cancel a call after about 60 s, so a heavy call answers with a job handle before that.
    job_wait_s: float = Field(default=45.0, ge=0, description="How long a heavy call waits before returning a job handle.")
    job_max_wait_s: float = Field(default=600.0, gt=0, description="The longest wait_s a client may ask for.")
    parallel_jobs: int = Field(default_factory=lambda: max(1, min(8, os.cpu_count() or 1)), ge=1,
                               description="Jobs running at once (builds in parallel; timing stays one per device).")
    precompiled_headers: bool = Field(default=True, description="After a C++ build, precompile torch/extension.h "
                                      "for its flags in the background, so later builds with those flags skip parsing it.")
    warm_workers: int = Field(default=2, ge=0, le=16, description="Workers kept started (torch imported, device "
                              "ready) per available backend, so a job does not wait for start-up; 0: every worker starts cold.")
    queue_limit: int = Field(default=32, ge=1, description="Queued jobs per accelerator before calls get 'busy'.")
    # HTTP (the token itself is read from KFORGE_TOKEN or a token file, never from the config file).
    token_file: Path | None = Field(default=None, description="File holding the bearer token (instead of KFORGE_TOKEN).")
    allowed_hosts: list[str] = Field(default_factory=list, description="Extra Host header values to accept (the "
                                     "public name behind a reverse proxy, e.g. 'gpu.example.com'); loopback is always allowed.")
    allowed_origins: list[str] = Field(default_factory=list, description="Extra Origin values to accept (browser clients).")
    max_request_mb: float = Field(default=64.0, gt=0, description="Largest HTTP request body (screenshots are up to 8 x 8 MiB).")
    certfile: Path | None = Field(default=None, description="TLS certificate (PEM) for HTTP; with keyfile, serves HTTPS.")
    keyfile: Path | None = Field(default=None, description="TLS private key (PEM).")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=config_file())


def analyst_config(settings: Settings) -> AnalystConfig:
    """The analyst for these settings; ValueError when a model analyst lacks its model name."""
    if settings.analyst in ("anthropic", "openai"):
        if not settings.analyst_model:
            raise ValueError(f"KFORGE_ANALYST={settings.analyst} needs KFORGE_ANALYST_MODEL (the model's name)")
        model = ModelConfig(api=settings.analyst, model=settings.analyst_model, base_url=settings.analyst_base_url,
                            api_key_env=settings.analyst_api_key_env, timeout_s=settings.analyst_timeout_s,
                            vision=settings.analyst_vision)
        return AnalystConfig(provider=settings.analyst, model=model)
    return AnalystConfig(provider=settings.analyst)


def tool_context(settings: Settings) -> ToolContext:
    """The tools' context for these settings: configuration is read once here and passed down."""
    memory = settings.worker_memory_mb * 2**20 if settings.worker_memory_mb else None
    files = settings.worker_file_mb * 2**20 if settings.worker_file_mb else None
    return ToolContext(home=settings.home, keep_scratch=settings.keep_scratch,
                       limits=WorkerLimits(timeout_s=settings.worker_timeout_s, memory_bytes=memory, file_bytes=files,
                                           isolate_network=settings.worker_network == "isolated",
                                           precompiled_headers=settings.precompiled_headers))
