"""The compact JSON copy of a tool result, for clients that read only text content.

The MCP specification advises a tool that returns structured content to send it as JSON text too,
for older clients. A verbatim copy of a verify result is 8-12 kB, most of it nulls, the spec again
inside the compile section, and per-trial, per-output detail that says "all fine" five times. The
structured content keeps everything (and the output schema); this copy keeps what an agent reads:

- no nulls, no empty lists or objects, no field left at its default (the output schema states defaults);
- the spec once, at the top (nested results drop theirs);
- passing checks by name only (`checks_passed`); failing, warning and skipped ones with their evidence;
- a correct trial as its number, seed, distribution and errors; a correct output as its errors;
  full detail only for what failed, with its first `_FIRST_MISMATCHES` mismatching elements; a wrong
  output that fails as the first wrong trial's did (same shapes, same problems but for the numbers, which
  its own fields give) says `same_as_trial` instead of repeating them;
- an output's tolerance only when it is not one of the result's `tolerances`, and its `got` only when it
  differs from `expected`;
- numbers to 4 significant digits (the structured content has them exact).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

__all__ = ["compact_copy"]

_DIGITS = 4
_FIRST_MISMATCHES = 3
_NUMBER = re.compile(r"[-+]?\d[\d.e+-]*")
# Fields of a wrong output that a later trial usually repeats word for word.
_REPEATED_KEYS = ("expected", "got", "problems")
# Tolerance fields that decide a verdict; `bound_why` only restates the output's reference_rel_error.
_TOLERANCE_KEYS = ("dtype", "atol", "rtol", "precision", "rel_error_bound")
# What a correct output keeps: enough to see how close it came.
_CORRECT_OUTPUT_KEYS = ("output", "max_abs_error", "rel_error")
# What a correct trial keeps besides its outputs.
_CORRECT_TRIAL_KEYS = ("trial", "seed", "distribution", "correct")


def compact_copy(result: BaseModel) -> dict[str, Any]:
    """`result` as JSON without nulls, defaults, repeats and the detail of what passed."""
    data = result.model_dump(mode="json", exclude_defaults=True)
    tolerances = [_tolerance_key(t) for t in _lean(_round(data.get("tolerances") or []))]
    out = _lean(_round(_drop_nested_specs(data, top=True)))
    if "checks" in data:
        _split_checks(out)
    if "trials" in out:
        out["trials"] = [_trial(t, tolerances) for t in out["trials"]]
        _mark_repeats(out["trials"])
    return out


def _drop_nested_specs(value: Any, *, top: bool = False) -> Any:
    """The spec stays at the top only: a nested result (verify's compile section) repeats it."""
    if isinstance(value, dict):
        return {k: _drop_nested_specs(v) for k, v in value.items() if top or k != "spec"}
    if isinstance(value, list):
        return [_drop_nested_specs(v) for v in value]
    return value


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.{_DIGITS}g}")
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_round(v) for v in value]
    return value


def _tolerance_key(tolerance: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(tolerance.get(k) for k in _TOLERANCE_KEYS)


def _lean(value: Any) -> Any:
    """Drop None, empty lists and empty objects, at every depth."""
    if isinstance(value, dict):
        kept = {k: _lean(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None and v != [] and v != {}}
    if isinstance(value, list):
        return [_lean(v) for v in value]
    return value


def _split_checks(out: dict[str, Any]) -> None:
    checks = out.pop("checks", None) or []
    passed = [c["name"] for c in checks if c.get("status") == "pass"]
    others = [c for c in checks if c.get("status") != "pass"]
    if others:
        out["checks"] = others
    if passed:
        out["checks_passed"] = passed


def _trial(trial: dict[str, Any], tolerances: list[tuple[Any, ...]]) -> dict[str, Any]:
    outputs = [_output(o, tolerances) for o in trial.get("outputs", [])]
    if trial.get("correct"):
        kept = {k: trial[k] for k in _CORRECT_TRIAL_KEYS if k in trial}
    else:
        kept = {k: v for k, v in trial.items() if k != "outputs"}
    return {**kept, "outputs": outputs} if outputs else kept


def _output(output: dict[str, Any], tolerances: list[tuple[Any, ...]]) -> dict[str, Any]:
    if output.get("correct"):
        return {k: output[k] for k in _CORRECT_OUTPUT_KEYS if k in output}
    lean = dict(output)
    if "tolerance" in lean and _tolerance_key(lean["tolerance"]) in tolerances:  # stated in the result's `tolerances`
        del lean["tolerance"]
    if "first_mismatches" in lean:
        lean["first_mismatches"] = lean["first_mismatches"][:_FIRST_MISMATCHES]
    if lean.get("got") == lean.get("expected"):
        lean["got"] = "as expected"
    return lean


def _words(output: dict[str, Any]) -> tuple[str, ...]:
    """What a wrong output's repeated fields say, numbers left out."""
    return tuple(_NUMBER.sub("#", repr(output.get(k))) for k in _REPEATED_KEYS)


def _mark_repeats(trials: list[dict[str, Any]]) -> None:
    first: dict[int, tuple[int, tuple[str, ...]]] = {}  # output position -> (trial, its words)
    for trial in trials:
        for output in trial.get("outputs", []):
            if output.get("correct", True) is True or "problems" not in output:
                continue
            pos, words = output.get("output", 0), _words(output)
            if pos not in first:
                first[pos] = (trial.get("trial", 0), words)
            elif first[pos][1] == words:
                for k in _REPEATED_KEYS:
                    output.pop(k, None)
                output["same_as_trial"] = first[pos][0]
