"""How a value that breaks a declared rule is described: the one wording of every refusal, whether
the value came from the config file (:mod:`lyre.config.load`), a request (:mod:`lyre.service.options`)
or an engine's last check (:meth:`lyre.engine.base.SamplingParams.validate`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import annotated_types
from pydantic import BaseModel

from lyre.errors import InvalidRequest, OutOfRange, shorten

_LIMIT_NAMES = {annotated_types.Ge: "ge", annotated_types.Gt: "gt", annotated_types.Le: "le", annotated_types.Lt: "lt",
                annotated_types.MultipleOf: "multiple_of"}


def limits_of(model: type[BaseModel], name: str) -> dict[str, Any]:
    """``{"ge": 0.0, "le": 5.0}``: the declared range of field ``name`` of ``model``."""
    out = {}
    for item in model.model_fields[name].metadata:
        key = _LIMIT_NAMES.get(type(item))
        if key is not None:
            out[key] = getattr(item, key)
    return out


def describe_range(limits: Mapping[str, Any]) -> str:
    parts = [f"{sym} {limits[name]}" for name, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
             if name in limits]
    if "multiple_of" in limits:
        parts.append(f"a multiple of {limits['multiple_of']}")
    return "must be " + " and ".join(parts)


RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "multiple_of"}
EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "string_type": "a string", "bool_type": "true or false", "bool_parsing": "true or false",
    "tuple_type": "a list", "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping of keys",
    "model_attributes_type": "a mapping of keys",
}


class ConfigError(ValueError):
    """A configuration value a user supplied is not acceptable."""


def request_error(model: type[BaseModel], err: Mapping[str, Any]) -> InvalidRequest:
    """pydantic's error ``err`` about a request (or its sampling) validated as ``model``, as the
    InvalidRequest (or OutOfRange) every surface answers with: it names the option, the value and
    the rule."""
    name = ".".join(str(part) for part in err["loc"]) or "request"
    kind, got = err["type"], shorten(err.get("input"))
    if kind == "extra_forbidden":
        return InvalidRequest(f"unknown option '{name}'; allowed: {', '.join(model.model_fields)}")
    if kind == "missing":
        return InvalidRequest(f"'{name}' is required")
    if kind in RANGE_ERRORS:
        return OutOfRange(f"'{name}' = {got} is out of range: {describe_range(limits_of(model, name))}")
    if kind in EXPECTED:
        return InvalidRequest(f"'{name}' must be {EXPECTED[kind]}, got {got}")
    if kind == "string_too_long":
        return InvalidRequest(f"'{name}' is longer than {err['ctx']['max_length']} characters")
    if kind == "literal_error":
        return OutOfRange(f"'{name}' must be {err['ctx']['expected']}, got {got}")
    if kind == "value_error":  # a rule between options names them itself
        return InvalidRequest(f"'{name}' {err['ctx']['error']}" if err["loc"] else str(err["ctx"]["error"]))
    return InvalidRequest(f"'{name}': {err['msg']}, got {got}")
