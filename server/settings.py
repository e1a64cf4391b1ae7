"""Server configuration, read once by the command line: environment (``KFORGE_*``) over a TOML file.

The only place that reads KForge's variables from the environment: everything below gets them from here,
passed down (the tools through their `ToolContext`).

The file is ``$KFORGE_CONFIG`` or ``<user config dir>/kforge/config.toml`` (e.g. ~/.config/kforge/config.toml),
with the same names in lower case and without the prefix (``analyst = "openai"``). Secrets (API keys,
the server token) are read from the environment only, never from this file.
"""

from __future__ import annotations

import difflib
import os
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from kforge.profilers.analyst.http import ModelConfig
from kforge.tools.context import ToolContext
from kforge.tools.fleet import RayFleet
from kforge.tools.fleet_node import NodeConfig
from kforge.tools.process.limits import WorkerLimits
from kforge.tools.summarize import AnalystConfig
from kforge.tools.tool_inputs import DEFAULT_BUDGET_S, DEFAULT_WAIT_S, BudgetS

from .kernelbench import REPOSITORY, problems_dir

__all__ = ["ConfigError", "Settings", "analyst_config", "config_file", "load_settings", "ray_fleet", "settings_environment",
           "tool_context"]


class ConfigError(ValueError):
    """A configuration the server cannot start with; the message names the file or variable and the key."""


def config_file() -> Path:
    return Path(os.environ.get("KFORGE_CONFIG") or Path(platformdirs.user_config_dir("kforge")) / "config.toml")


def _near(name: str, known: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _TomlFile(TomlConfigSettingsSource):
    """The config file, refusing what would otherwise be dropped without a word: syntax errors and unknown keys."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        try:
            super().__init__(settings_cls, toml_file=path)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot be read: {exc}") from None
        known = set(settings_cls.model_fields)
        for key in self.toml_data:
            if key in _SECRETS:
                raise ConfigError(f"{path}: {key!r} is a secret, read from the environment only "
                                  f"(KFORGE_{key.upper()}) or a file of its own, never from the config file")
            if key not in known:
                raise ConfigError(f"{path}: unknown key {key!r}{_near(key, known)}; the keys are the KFORGE_* "
                                  "variables in lower case without the prefix (README: Commands and configuration)")


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
    timing_budget_s: BudgetS = Field(default=DEFAULT_BUDGET_S, description="Default time budget per timed model "
                                     "(profile_kernel's budget_s).")
    worker_network: Literal["isolated", "host"] = Field(
        default="isolated", description="Workers start in a network namespace of their own (no network), where the "
        "OS allows it; 'host' leaves them on the host's network.")
    worker_sandbox: bool = Field(default=True, description="Workers run in a sandbox of their own (namespaces, "
        "private /tmp, Landlock, no capabilities, a system-call filter: README, Security); off only to debug it.")
    worker_read_paths: list[Path] = Field(default_factory=list, description="Directories workers may read beyond "
        "the system's and Python's, e.g. a CUTLASS checkout that candidates' builds include (read-only).")
    allow_partial_sandbox: bool = Field(default=False, description="Let `serve --transport http` run where the host "
        "refuses part of the sandbox (what is missing is still reported by doctor and in every result).")
    worker_file_mb: int | None = Field(default=16384, description="Largest file a worker may write (RLIMIT_FSIZE); 0 disables it.")
    worker_max_tasks: int = Field(default=0, ge=0, description="Processes and threads a worker may have at once (its PID "
                                  "namespace's pid_max, Linux 6.14+); 0: max(4096, 32 per core).")
    # Jobs: desktop clients cancel a call after about 60 s, so a heavy call answers with a job handle before that.
    job_wait_s: float = Field(default=DEFAULT_WAIT_S, ge=0, description="How long a heavy call waits before returning "
                              "a job handle (the tools' default wait_s).")
    job_max_wait_s: float = Field(default=600.0, gt=0, description="The longest wait_s a client may ask for.")
    parallel_jobs: int = Field(default_factory=lambda: max(1, min(8, os.cpu_count() or 1)), ge=1,
                               description="Jobs running at once on each device, each GPU of a host "
                               "its own (builds in parallel; timing stays one per device); at most the host's cores "
                               "in all.")
    precompiled_headers: bool = Field(default=True, description="After a C++ build, precompile torch/extension.h "
                                      "for its flags in the background, so later builds with those flags skip parsing it.")
    warm_workers: int = Field(default=2, ge=0, le=16, description="Workers kept started (torch imported, device "
                              "ready) per available backend, so a job does not wait for start-up; 0: every worker starts cold.")
    max_forks: int = Field(default=0, ge=0, le=64, description="Warm workers forked at once, by the whole pool (0: "
                           "no limit). The host starts device contexts one at a time, so N forks started together all "
                           "arrive after about N/4 s; fewer at once bring the first ones sooner, those a job waits for "
                           "first. Off until a GPU run has measured it.")
    warm_baselines: Literal["gpu", "all", "off"] = Field(
        default="gpu", description="Compile a problem's torch.compile baseline ahead, in a judge of its own beside "
        "its first candidate's compile or verify, so the profile after them does not wait for the compile: 'gpu' "
        "backends only (the default: a CPU backend's trials need the cores the compile takes), 'all', or 'off'. "
        "On KernelBench problems (2x H200) with an agent's 5 s turn before the profile, a new problem's first profile "
        "took 1.45-2.26 s instead of 3.17-4.74 s; with calls back to back it saves 0.1-0.7 s.")
    warm_timing: bool = Field(default=True, description="Where a torch.compile baseline is compiled ahead "
                              "(KFORGE_WARM_BASELINES), also time it and eager (its canary) once the compile is done, "
                              "alone on the device as any timing, with the default budget: the profile that follows "
                              "reuses it while eager times within 2%, and times only eager and the candidate. On "
                              "KernelBench problems (2x H200, an agent's 5 s turn) a new problem's first profile took "
                              "1.19-2.49 s instead of 1.65-3.17 s, its timings within 0.6% of do_bench.")
    queue_limit: int = Field(default=32, ge=1, description="Queued jobs per accelerator before calls get 'busy'.")
    cache_max_gb: float = Field(default=20.0, ge=0, description="Most disk the rebuildable caches under the data "
                                "directory may take (builds, precompiled headers at about 0.8 GB each, compiler caches); "
                                "`kforge serve` and `kforge prune` delete the least recently used beyond it; 0: no cap.")
    # A fleet: jobs run on a Ray cluster's nodes instead of this host (README: Fleet (Ray)).
    ray: str | None = Field(default=None, description="Run compile, verify and profile jobs on a Ray cluster: 'auto' "
                            "(the cluster this host joined with `ray start`) or the head's address (host:6379); unset: "
                            "on this host. Needs Ray on this host and every node: pip install 'kforge[ray]'.")
    ray_node_home: Path | None = Field(default=None, description="Data directory on each Ray node (its build caches, "
                                       "scratch and own store; '~' is the node's home); default: the node's user data directory.")
    ray_cpus_per_job: float = Field(default=1.0, gt=0, description="CPUs a cpu-backend job reserves on its Ray node; "
                                    "candidate and baselines run with that many OpenMP threads, and a node runs one job per that many CPUs.")
    ray_max_jobs: int = Field(default=64, ge=1, description="Jobs handed to the Ray cluster at once; each starts when "
                              "a node has its resources (the rest wait in this server's queues).")
    kernelbench_dir: Path | None = Field(default=None, description="A KernelBench checkout (its root, or its "
                                         "KernelBench/ folder), so tools accept problem='kernelbench:level1/23_Softmax'.")
    trace: Path | None = Field(default=None, description="A file to append one JSON line to per worker start, worker "
                               "call and span of the server's own work: where a call's time goes.")
    # HTTP. The token is read from KFORGE_TOKEN (never from the config file: `_SECRETS`) or a token file.
    token: SecretStr | None = Field(default=None, exclude=True, description="The bearer token HTTP clients must send.")
    token_file: Path | None = Field(default=None, description="File holding the bearer token (instead of KFORGE_TOKEN).")
    allowed_hosts: list[str] = Field(default_factory=list, description="Extra Host header values to accept (the "
                                     "public name behind a reverse proxy, e.g. 'gpu.example.com'); loopback is always allowed.")
    allowed_origins: list[str] = Field(default_factory=list, description="Extra Origin values to accept (browser clients).")
    max_request_mb: float = Field(default=64.0, gt=0, description="Largest HTTP request body (screenshots are up to 8 x 8 MiB).")
    certfile: Path | None = Field(default=None, description="TLS certificate (PEM) for HTTP; with keyfile, serves HTTPS.")
    keyfile: Path | None = Field(default=None, description="TLS private key (PEM).")

    @field_validator("home", "kernelbench_dir")
    @classmethod
    def _expand_user(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("kernelbench_dir")
    @classmethod
    def _is_kernelbench(cls, value: Path | None) -> Path | None:
        # Said at start, not at the first `problem="kernelbench:..."` an agent sends.
        if value is not None and problems_dir(value) is None:
            raise ValueError(f"{value} is not a KernelBench checkout (no KernelBench/level1/ in it); clone {REPOSITORY}")
        return value

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _TomlFile(settings_cls, config_file())


# Settings read from the environment only: never from the config file, never copied into a client's configuration.
_SECRETS = {"token"}
# KFORGE_* variables that are no settings: no "unknown variable" warning for them. KFORGE_CONFIG names the file
# (`config_file`); KFORGE_CI_VENV is the CI scripts' own.
_OTHER_VARIABLES = {"KFORGE_CONFIG", "KFORGE_CI_VENV"}


def settings_environment() -> dict[str, str]:
    """The KFORGE_* variables of this environment that configure a server (its settings and KFORGE_CONFIG, never a
    secret), for a client's configuration that starts one (`kforge config`)."""
    wanted = {f"KFORGE_{k.upper()}" for k in Settings.model_fields if k not in _SECRETS} | {"KFORGE_CONFIG"}
    return {k: v for k, v in sorted(os.environ.items()) if k in wanted}


def load_settings(*, flags: dict[str, str] | None = None, **overrides: object) -> Settings:
    """Settings from the command line's `overrides`, the environment and the config file, in that order.

    Raises ConfigError saying where a bad value came from (the variable, the file or the option; `flags`
    maps a setting to its option's name), and warns on stderr about a KFORGE_* variable that looks like a
    misspelt setting (the environment holds other programs' variables too, so it is not refused)."""
    known = sorted(Settings.model_fields)
    for name in os.environ:
        key = name.removeprefix("KFORGE_").lower()
        if not name.startswith("KFORGE_") or name in _OTHER_VARIABLES or key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
        if close:
            print(f"kforge: warning: {name} is not a setting (did you mean KFORGE_{close[0].upper()}?)", file=sys.stderr)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError("; ".join(_where(err, overrides, flags or {}) for err in exc.errors())) from None


def _where(err: dict, overrides: dict[str, object], flags: dict[str, str]) -> str:
    key = str(err["loc"][0]) if err["loc"] else ""
    if key in overrides:
        origin = flags.get(key, key)
    elif f"KFORGE_{key.upper()}" in os.environ:
        origin = f"KFORGE_{key.upper()}"
    else:
        origin = f"{config_file()}: {key}"
    return f"{origin}: {err['msg']} (got {err.get('input')!r})"


def analyst_config(settings: Settings) -> AnalystConfig:
    """The analyst for these settings; ValueError when a model analyst lacks its model name."""
    if settings.analyst in ("anthropic", "openai"):
        if not settings.analyst_model:
            raise ValueError(f"KFORGE_ANALYST={settings.analyst} needs KFORGE_ANALYST_MODEL (the model's name)")
        model = ModelConfig(api=settings.analyst, model=settings.analyst_model, base_url=settings.analyst_base_url,
                            api_key_env=settings.analyst_api_key_env, timeout_s=settings.analyst_timeout_s,
                            vision=settings.analyst_vision)
        # The key itself is read here, as every setting is, and passed down; it is never written to a result.
        return AnalystConfig(provider=settings.analyst, model=replace(model, api_key=os.environ.get(model.key_env)))
    return AnalystConfig(provider=settings.analyst)


def secret_files(settings: Settings) -> tuple[str, ...]:
    """Files of the server's that no worker may read: the token file and the TLS key."""
    return tuple(str(p.expanduser().resolve()) for p in (settings.token_file, settings.keyfile) if p is not None)


def tool_context(settings: Settings) -> ToolContext:
    """The tools' context for these settings: configuration is read once here and passed down."""
    memory = settings.worker_memory_mb * 2**20 if settings.worker_memory_mb else None
    files = settings.worker_file_mb * 2**20 if settings.worker_file_mb else None
    return ToolContext(home=settings.home, keep_scratch=settings.keep_scratch, warm_baselines=settings.warm_baselines,
                       warm_timing=settings.warm_timing, timing_budget_s=settings.timing_budget_s,
                       max_forks=settings.max_forks,
                       limits=WorkerLimits(timeout_s=settings.worker_timeout_s, memory_bytes=memory, file_bytes=files,
                                           isolate_network=settings.worker_network == "isolated",
                                           sandbox=settings.worker_sandbox, hidden_files=secret_files(settings),
                                           read_paths=tuple(str(p.expanduser().resolve()) for p in settings.worker_read_paths),
                                           precompiled_headers=settings.precompiled_headers,
                                           max_tasks=settings.worker_max_tasks,
                                           trace_file=str(settings.trace) if settings.trace else None))


def ray_fleet(settings: Settings, tools: ToolContext) -> RayFleet | None:
    """The Ray cluster that runs this server's jobs (None: they run on this host). Its nodes get this server's
    worker limits; their data directory is `ray_node_home`, else their own default (not this server's)."""
    if not settings.ray:
        return None
    # The trace file is a path of this host: a node traces into its own data directory (`NodeConfig.trace`).
    node = NodeConfig(limits=replace(tools.limits, trace_file=None),
                      home=str(settings.ray_node_home) if settings.ray_node_home else None,
                      keep_scratch=settings.keep_scratch, warm_workers=settings.warm_workers,
                      trace=settings.trace is not None, warm_baselines=settings.warm_baselines,
                      warm_timing=settings.warm_timing, timing_budget_s=settings.timing_budget_s,
                      max_forks=settings.max_forks)
    return RayFleet(settings.ray, node, tools.store, cpus_per_job=settings.ray_cpus_per_job)
