"""Jinja2 templates of `kforge.resources/prompts`: the analyst's request and the generation agent's prompts.

StrictUndefined: a template that names a variable the caller did not pass fails loudly instead of
rendering an empty string into a prompt.
"""

from __future__ import annotations

import jinja2
import jinja2.meta

__all__ = ["render", "template_names", "variables"]

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("kforge.resources", "prompts"), undefined=jinja2.StrictUndefined,
                          autoescape=False, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def render(name: str, **values: object) -> str:
    return _ENV.get_template(name).render(**values)


def template_names() -> list[str]:
    return sorted(_ENV.list_templates(extensions=["j2"]))


def variables(name: str) -> set[str]:
    """The variables a template reads (its prompt's arguments)."""
    source = _ENV.loader.get_source(_ENV, name)[0]  # type: ignore[union-attr]
    return jinja2.meta.find_undeclared_variables(_ENV.parse(source))
