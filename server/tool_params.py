"""A tool's parameters from the models that define its inputs, so the MCP schema is never a second copy.

The SDK builds a tool's input schema from the function's signature (`inspect.signature`, which honours
`__signature__`) and finds its `Context` and `Resolve` parameters from its annotations (`get_type_hints`, which
reads `__annotations__`). `takes` sets both from the fields of pydantic models: each field becomes a keyword
parameter annotated with its type and its `FieldInfo` (bounds, description), with the field's default.
"""

from __future__ import annotations

import copy
import inspect
from typing import Annotated, Any, Callable, Mapping, TypeVar

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

__all__ = ["input_fields", "takes"]

F = TypeVar("F", bound=Callable[..., Any])


def input_fields(*models: type[BaseModel], exclude: tuple[str, ...] = ()) -> dict[str, FieldInfo]:
    """The fields of `models` that a tool takes, by name; a later model's field replaces an earlier one's of
    the same name (e.g. a tool's optional `reference_code` beside a request's required one)."""
    fields: dict[str, FieldInfo] = {}
    for model in models:
        fields.update({name: info for name, info in model.model_fields.items() if name not in exclude})
    return fields


def _parameter(name: str, info: FieldInfo, default: Any) -> inspect.Parameter:
    # Annotated cannot carry the default (pydantic refuses one there): it goes on the parameter.
    constraints = copy.copy(info)
    constraints.default, constraints.default_factory = PydanticUndefined, None
    if default is PydanticUndefined and not info.is_required():
        default = info.get_default(call_default_factory=True)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[info.annotation, constraints],
                             default=inspect.Parameter.empty if default is PydanticUndefined else default)


def takes(*models: type[BaseModel], exclude: tuple[str, ...] = (),
          defaults: Mapping[str, Any] | None = None) -> Callable[[F], F]:
    """Give a tool function written as `fn(<its own parameters>, **arguments)` the fields of `models` as parameters.

    `exclude`: fields that are no input of the tool (a request's discriminator). `defaults`: defaults the server's
    settings replace (the wait before a job handle). The function's own annotated parameters (its `Context`, a
    `Resolve`d one) stay; its `**arguments` receives the fields, validated."""

    def apply(fn: F) -> F:
        own = inspect.signature(fn, eval_str=True)
        kept = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        fields = input_fields(*models, exclude=exclude)
        clash = {p.name for p in kept} & set(fields)
        if clash:
            raise TypeError(f"{fn.__name__}: parameters {sorted(clash)} are defined by its input models already")
        given = dict(defaults or {})
        unknown = set(given) - set(fields)
        if unknown:
            raise TypeError(f"{fn.__name__}: defaults for {sorted(unknown)}, which are none of its inputs")
        params = kept + [_parameter(name, info, given.get(name, PydanticUndefined)) for name, info in fields.items()]
        fn.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        fn.__annotations__ = {p.name: p.annotation for p in params if p.annotation is not inspect.Parameter.empty}
        if own.return_annotation is not inspect.Signature.empty:
            fn.__annotations__["return"] = own.return_annotation
        return fn

    return apply
