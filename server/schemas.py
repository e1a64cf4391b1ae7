"""Published output schemas, written with fewer subschemas: the same set of valid results, cheaper to check.

An MCP client checks each tool's output schema against the JSON Schema 2020-12 metaschema before its first call
of that tool (the Python SDK: `check_schema`, then a compiled validator). That check costs about 0.18 ms per
subschema on a 2-core VM, and pydantic writes each optional field as three of them
(`{"anyOf": [{"type": "number"}, {"type": "null"}]}`): a fresh client paid 56, 76 and 92 ms before its first
verify, profile and get_job (bench/results/README.md, twenty-ninth session). Writing such a field as
`{"type": ["number", "null"]}`, and leaving out pydantic's generated titles (annotations that no validator reads),
takes about 30% of that away. Same dialect (2020-12, MCP's default): hosts may refuse another (SEP-1613).
"""

from __future__ import annotations

from typing import Any

__all__ = ["compact_schema"]

# Keywords whose subschemas are a map of names, a list, or one schema.
_SCHEMA_MAPS = ("properties", "$defs", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_ONE_SCHEMA = ("items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames",
               "unevaluatedItems", "unevaluatedProperties")
# Keywords that constrain only instances of their own type (or annotate), so a null passes them: a branch made of
# these alone may join `"null"` in one `type` list. `enum`, `const`, `$ref` and the combinators constrain every
# instance, so a branch with one of them stays an `anyOf`.
_TYPED_KEYWORDS = frozenset({
    "type", "description", "default", "examples", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "pattern", "items", "prefixItems", "minItems",
    "maxItems", "uniqueItems", "properties", "required", "additionalProperties", "minProperties", "maxProperties",
})
_NULL = {"type": "null"}


def compact_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """`schema` with its nullable single-type fields as type lists and no titles below the root."""
    if schema is None:
        return None
    root_title = {"title": schema["title"]} if "title" in schema else {}
    return {**root_title, **_compact(schema)}


def _compact(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS:
            out[key] = {name: _compact(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS:
            out[key] = [_compact(sub) for sub in value]
        elif key in _ONE_SCHEMA:
            out[key] = _compact(value)
        elif key != "title":
            out[key] = value
    return _nullable_as_type_list(out)


def _nullable_as_type_list(schema: dict[str, Any]) -> dict[str, Any]:
    """`{"anyOf": [{"type": T, ...}, {"type": "null"}], ...}` as `{"type": [T, "null"], ..., ...}` where that
    accepts the same instances: T one type name, the branch only type-specific keywords, no key on both levels."""
    branches = schema.get("anyOf")
    if not isinstance(branches, list) or len(branches) != 2 or _NULL not in branches:
        return schema
    other = branches[0] if branches[1] == _NULL else branches[1]
    outer = {k: v for k, v in schema.items() if k != "anyOf"}
    if (not isinstance(other, dict) or not isinstance(other.get("type"), str) or other["type"] == "null"
            or not set(other) <= _TYPED_KEYWORDS or set(other) & set(outer)):
        return schema
    return {**outer, **other, "type": [other["type"], "null"]}
