"""Data, not code: the per-backend examples, the problem pack, the prompt templates and the candidate format, read
through `importlib.resources`; `templates` renders the prompts.
"""

__all__ = ["templates"]
