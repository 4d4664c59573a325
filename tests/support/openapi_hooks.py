"""Schemathesis hooks for ``tests/api/http/test_openapi_fuzz.py`` (loaded by the ``st`` command via
``SCHEMATHESIS_HOOKS``): generated requests name a voice that exists often enough to get past the
404 and reach synthesis, and the voice routes see a built-in voice as well as generated ids.

Only a value the schema allows is swapped for another one it allows, so a request generated to
be invalid stays invalid (its invalid part is elsewhere)."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import strategies as st

from lyre.service.options import MAX_NAME_CHARS

VOICES = ("tara", "leo", "alloy")  # built-in voices and an OpenAI alias of one


def _with_voice(values: Any, field: str, most: int | None = None):
    value = values.get(field) if isinstance(values, dict) else None
    if not isinstance(value, str) or (most is not None and len(value) > most):
        return st.just(values)
    return st.sampled_from([*VOICES, value]).map(lambda voice: {**values, field: voice})


@schemathesis.hook
def flatmap_body(context, body: Any):
    return _with_voice(body, "voice", MAX_NAME_CHARS)


@schemathesis.hook
def flatmap_path_parameters(context, path_parameters: Any):
    return _with_voice(path_parameters, "voice_id")
