"""Precompile torch/extension.h when a server starts, so the first new candidate builds fast too.

The precompiled header for a set of flags is made in the background after the first build with those
flags (`kforge.backends.build.fast_build`), so without this the first candidate of a fresh install pays for the
whole header (about 2x slower). Building each backend's `load_inline` example once at start makes
the header for the flags most candidates use (the examples' flags: none beyond the backend's
defaults). After the first start the example is a cache hit and the header is already there.
"""

from __future__ import annotations

import logging

from kforge.tools.context import ToolContext
from kforge.tools.evaluate import compile_kernel
from kforge.tools.requests import CompileRequest

from . import catalog

__all__ = ["prewarm_builds"]

logger = logging.getLogger(__name__)


async def prewarm_builds(tools: ToolContext) -> list[str]:
    """Build every available backend's `load_inline` examples once; returns what was built, as "backend: seconds"."""
    done = []
    for avail in await tools.availability():
        if not avail.ok:
            continue
        for source in catalog.inline_build_examples(avail.backend):
            try:
                result = await compile_kernel(tools, CompileRequest(backend=avail.backend, candidate_code=source,
                                                                    use_store=False))
            except Exception as exc:  # noqa: BLE001 - a warm-up must never take the server down
                logger.warning("prewarm build for %s failed: %s: %s", avail.backend, type(exc).__name__, exc)
                continue
            if not result.ok:
                logger.warning("prewarm build for %s failed: %s", avail.backend, result.failure)
            done.append(f"{avail.backend}: {result.load_seconds:.1f} s")
    return done
