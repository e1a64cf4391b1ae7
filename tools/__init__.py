"""What each tool does, server side: compile, verify, profile, summarize; jobs, the result store, the verdict.

`process` is the parent-side plumbing of the worker processes, `harness` what runs inside them (ARCHITECTURE.md).
Its surface is its modules; nothing is imported here, so importing one tool never imports the others.
"""

__all__ = ["context", "device_use", "disk", "dispatch", "evaluate", "fleet", "fleet_node", "gpus", "harness", "jobs", "models",
           "process", "profile", "requests", "rounds", "static_scan", "steps", "store", "summarize", "tool_inputs",
           "trials", "verdict"]
