"""Published output schemas: compacted (nullable fields as type lists, no titles below the root), still valid
2020-12 schemas, and accepting exactly what pydantic's own schemas accept."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator
from mcp.client import Client

from kforge.server.app import build_server
from kforge.server.schemas import compact_schema
from kforge.server.settings import Settings

pytestmark = pytest.mark.anyio


def accepts(schema: dict, instance) -> bool:
    return Draft202012Validator(schema).is_valid(instance)


def subschemas(schema) -> int:
    if isinstance(schema, dict):
        return 1 + sum(subschemas(v) for v in schema.values())
    if isinstance(schema, list):
        return sum(subschemas(v) for v in schema)
    return 0


def titles(schema) -> int:
    """Title keywords (a string value; a property named "title" has a schema)."""
    if isinstance(schema, dict):
        return sum(isinstance(v, str) if k == "title" else titles(v) for k, v in schema.items())
    if isinstance(schema, list):
        return sum(titles(v) for v in schema)
    return 0


def nullable(branch: dict, **outer) -> dict:
    return {"type": "object", "properties": {"x": {"anyOf": [branch, {"type": "null"}], **outer}}}


CASES = [
    # (a field's schema, instances of x to try under both forms)
    (nullable({"type": "number", "minimum": 0}, default=None, title="X"), [None, 1.5, -1, "a", 0]),
    (nullable({"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}], "minItems": 2,
               "maxItems": 2}), [None, [1, 2], [1], [1, "a"], 3]),
    (nullable({"type": "string", "enum": ["pass", "fail"]}), [None, "pass", "other", 1]),
    (nullable({"type": "string", "const": "a"}), [None, "a", "b"]),
    (nullable({"$ref": "#/$defs/Y"}), [None, {"y": 1}, {"y": "a"}, 2]),
    (nullable({"type": "integer", "description": "inner"}, description="outer"), [None, 3, 3.5, "3"]),
    (nullable({"type": "null"}), [None, 1]),
]


@pytest.mark.parametrize("field,instances", CASES)
def test_a_compacted_schema_accepts_exactly_what_the_original_does(field, instances):
    original = {**field, "$defs": {"Y": {"type": "object", "properties": {"y": {"type": "integer"}}}}}
    compacted = compact_schema(original)
    Draft202012Validator.check_schema(compacted)
    for x in instances:
        assert accepts(compacted, {"x": x}) == accepts(original, {"x": x}), (x, json.dumps(compacted))


def test_only_type_specific_branches_join_null_in_a_type_list():
    merged = compact_schema(nullable({"type": "number", "minimum": 0}, default=None, title="X"))
    assert merged["properties"]["x"] == {"type": ["number", "null"], "minimum": 0, "default": None}
    for kept in ({"type": "string", "enum": ["a"]}, {"$ref": "#/$defs/Y"}):
        assert "anyOf" in compact_schema(nullable(kept))["properties"]["x"]
    clash = nullable({"type": "integer", "description": "inner"}, description="outer")
    assert compact_schema(clash)["properties"]["x"] == clash["properties"]["x"]  # no key is dropped


def test_a_property_named_title_is_kept_and_only_the_root_keeps_its_title():
    schema = {"title": "Root", "type": "object", "properties": {"title": {"type": "string", "title": "Title"}}}
    assert compact_schema(schema) == {"title": "Root", "type": "object", "properties": {"title": {"type": "string"}}}


async def test_the_server_publishes_compacted_schemas_its_results_still_meet(tmp_path):
    server = build_server(Settings(home=tmp_path, warm_workers=0, precompiled_headers=False))
    originals = {t.name: t.output_schema for t in await super(type(server), server).list_tools()}
    async with Client(server) as client:
        published = {t.name: t.output_schema for t in (await client.list_tools()).tools}
        for name, schema in published.items():
            if schema is None:
                continue
            Draft202012Validator.check_schema(schema)
            assert titles({k: v for k, v in schema.items() if k != "title"}) == 0, name
            assert subschemas(schema) <= subschemas(originals[name]), name
        for name in ("verify_against_reference", "profile_kernel", "get_job"):  # the ones a first problem checks
            assert subschemas(published[name]) < 0.8 * subschemas(originals[name]), name
        # The client checks each structured result against the published schema: a mismatch is an error here.
        backends = await client.call_tool("list_backends", {})
        assert not backends.is_error and backends.structured_content["backends"]
        assert accepts(published["list_backends"], backends.structured_content)
