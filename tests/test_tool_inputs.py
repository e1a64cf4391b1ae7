"""Each tool input is defined once: the MCP tools' input schemas come from the request models and input models.

A client (the SDK's own, over stdio to a real `kforge serve`) must see, for every field of the models that define a
tool's inputs, the field's own type, default, bounds and description; defaults the server's settings replace
(wait_s, budget_s) show the configured value. And the server's schema must really come from those models: a field
added to a model shows up in the tool without touching the server.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from mcp import Client
from pydantic import BaseModel, Field

from kforge.server import app
from kforge.server.settings import Settings
from kforge.server.tool_params import input_fields, takes
from kforge.tools.requests import CompileRequest, ProfileRequest, VerifyRequest
from kforge.tools.tool_inputs import PRECISIONS, JobLookup, ReferenceChoice, SummarizeInputs, Waiting

from .conftest import stdio_session

pytestmark = pytest.mark.anyio

# What each tool takes: the models whose fields are its parameters (a later model's field replaces an earlier one's).
TOOL_INPUTS: dict[str, tuple[type[BaseModel], ...]] = {
    "compile_kernel": (CompileRequest, ReferenceChoice, Waiting),
    "verify_against_reference": (VerifyRequest, ReferenceChoice, Waiting),
    "profile_kernel": (ProfileRequest, ReferenceChoice, Waiting),
    "get_job": (JobLookup, Waiting),
    "cancel_job": (JobLookup,),
    "summarize_profile": (SummarizeInputs,),
}
NOT_INPUTS = ("tool",)  # a request's discriminator: which tool, not an argument of it
WAIT_S, BUDGET_S = 17.0, 2.5  # the settings the server below runs with


def _expected(models: tuple[type[BaseModel], ...]) -> dict[str, dict]:
    """Each input's JSON schema as its defining model publishes it (the field of the last model that has it)."""
    found: dict[str, dict] = {}
    for model in models:
        properties = model.model_json_schema()["properties"]
        found.update({name: properties[name] for name in model.model_fields if name not in NOT_INPUTS})
    return found


def _required(models: tuple[type[BaseModel], ...]) -> set[str]:
    return {name for name, info in input_fields(*models, exclude=NOT_INPUTS).items() if info.is_required()}


async def test_every_tool_input_is_its_models_field_as_a_client_sees_it(tmp_path):
    env = {"KFORGE_JOB_WAIT_S": str(WAIT_S), "KFORGE_TIMING_BUDGET_S": str(BUDGET_S), "KFORGE_WARM_WORKERS": "0"}
    async with stdio_session(tmp_path, **env) as client:
        tools = {t.name: t.input_schema for t in (await client.list_tools()).tools}
    for tool, models in TOOL_INPUTS.items():
        schema, expected = tools[tool], _expected(models)
        assert set(schema["properties"]) == set(expected), tool
        assert set(schema.get("required", [])) == _required(models), tool
        for name, published in expected.items():
            seen = dict(schema["properties"][name])
            if name == "wait_s":  # the server's setting replaces the model's default
                assert seen.pop("default") == WAIT_S and published.pop("default") == Waiting().wait_s
            if name == "budget_s":
                assert seen.pop("default") == BUDGET_S and published.pop("default") == ProfileRequest.model_fields[
                    "budget_s"].default
            assert seen == published, f"{tool}.{name}"
    # What today's clients rely on, said outright (the loop above says it for every field).
    trials = tools["verify_against_reference"]["properties"]["trials"]
    assert (trials["default"], trials["minimum"], trials["maximum"]) == (5, 1, 50) and trials["description"]
    assert tools["profile_kernel"]["properties"]["precision"]["enum"] == list(PRECISIONS)
    assert tools["summarize_profile"]["properties"]["screenshots"]["anyOf"][0]["maxItems"] == 8


async def test_bounds_are_enforced_before_the_tool_runs(tmp_path):
    server = app.build_server(Settings(home=tmp_path, warm_workers=0, precompiled_headers=False))
    async with Client(server) as client:
        result = await client.call_tool("verify_against_reference", {
            "backend": "cpu", "candidate_code": "x = 1", "problem": "relu", "trials": 51})
        assert result.is_error and "less than or equal to 50" in result.content[0].text
        result = await client.call_tool("profile_kernel", {
            "backend": "cpu", "candidate_code": "x = 1", "problem": "relu", "precision": "fp8"})
        assert result.is_error and "precision" in result.content[0].text


class _VerifyWithSeeds(VerifyRequest):
    seeds: int = Field(default=3, ge=1, le=9, description="A field the server has never heard of.")


async def test_the_server_schema_comes_from_the_request_model(tmp_path, monkeypatch):
    """A field added to the request model is a parameter of the tool, with its bounds and description; a field
    missing from it is none: the server holds no second list of the inputs."""
    monkeypatch.setattr(app, "VerifyRequest", _VerifyWithSeeds)
    server = app.build_server(Settings(home=tmp_path, warm_workers=0, precompiled_headers=False))
    async with Client(server) as client:
        tools = {t.name: t.input_schema for t in (await client.list_tools()).tools}
    seeds = tools["verify_against_reference"]["properties"]["seeds"]
    assert (seeds["default"], seeds["minimum"], seeds["maximum"], seeds["description"]) == (
        3, 1, 9, "A field the server has never heard of.")

    class _NoTrials(VerifyRequest):
        pass
    del _NoTrials.model_fields["trials"]
    _NoTrials.model_rebuild(force=True)
    monkeypatch.setattr(app, "VerifyRequest", _NoTrials)
    server = app.build_server(Settings(home=tmp_path, warm_workers=0, precompiled_headers=False))
    async with Client(server) as client:
        tools = {t.name: t.input_schema for t in (await client.list_tools()).tools}
    assert "trials" not in tools["verify_against_reference"]["properties"]


def test_takes_builds_the_signature_and_refuses_a_second_definition():
    class Inputs(BaseModel):
        n: int = Field(default=2, ge=1, description="how many")
        name: str = Field(description="who")

    @takes(Inputs, defaults={"n": 4})
    async def tool(**arguments):
        return arguments

    params = inspect.signature(tool).parameters
    assert params["n"].default == 4 and params["name"].default is inspect.Parameter.empty
    assert tool.__annotations__["n"].__metadata__[0].description == "how many"
    with pytest.raises(TypeError, match="defined by its input models"):
        takes(Inputs)(lambda n, **arguments: None)  # a parameter that is a model's field too: a second definition
    with pytest.raises(TypeError, match="none of its inputs"):
        takes(Inputs, defaults={"m": 1})(lambda **arguments: None)


def test_the_precision_policy_is_defined_once():
    """The harness's comparison, the requests and the tools all take the one Literal of tool_inputs."""
    from kforge.tools.harness import compare

    assert compare.PRECISIONS is PRECISIONS
    for model in (VerifyRequest, ProfileRequest):
        assert model.model_json_schema()["properties"]["precision"]["enum"] == list(PRECISIONS)
    here = Path(__file__).resolve().parents[1]
    spelled = [p.relative_to(here) for folder in ("server", "tools") for p in (here / folder).rglob("*.py")
               if '"strict", "tf32", "fp16", "bf16"' in p.read_text()]
    assert spelled == [Path("tools/tool_inputs.py")]
