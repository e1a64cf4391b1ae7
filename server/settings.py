"""Server configuration, read once from the environment (``KFORGE_*``) by the command line."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from kforge.tools.context import ToolContext
from kforge.tools.runner import WorkerLimits

__all__ = ["Settings", "tool_context"]


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
    analyst: str = Field(default="rules", description="Analyst provider for summarize_profile.")
    timing_budget_s: float = Field(default=2.0, gt=0, le=60, description="Default time budget per timed model.")


def tool_context(settings: Settings) -> ToolContext:
    """The tools' context for these settings: configuration is read once here and passed down."""
    memory = settings.worker_memory_mb * 2**20 if settings.worker_memory_mb else None
    return ToolContext(home=settings.home, keep_scratch=settings.keep_scratch,
                       limits=WorkerLimits(timeout_s=settings.worker_timeout_s, memory_bytes=memory))
