"""KForge: an MCP tool server that turns a coding assistant into a kernel generation agent.

The repository root is this package: ``kforge.server`` (MCP surface), ``kforge.tools`` (what each
tool does), ``kforge.backends`` (one module per accelerator), ``kforge.profilers`` (collectors and
the analyst) and ``kforge.resources`` (examples, problems, prompt templates).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
