"""The server's side of the worker processes: starting them (`runner`), keeping warm ones (`pool`), their life seen
from outside (`lifecycle`: environment, trace, kill) and their bounds (`limits`), the holds on new workers that the
host's KForge processes share (`host_holds`), the sandbox,
the typed protocol and its channel, builds for sandboxed workers, a rerun profiler's launcher
(`profiled_launch`). Torch-free. Its surface is its
modules; nothing is imported here.
"""

__all__ = ["build_service", "channel", "host_holds", "lifecycle", "limits", "pool", "profiled_launch", "protocol",
           "runner", "sandbox"]
