"""Request options are defined once (lyre.service.options): any JSON value for any option is either refused
with InvalidRequest before the engine thread, or synthesizes."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lyre.config import SamplingConfig, load_config
from lyre.config.validation import limits_of
from lyre.engine.base import SamplingParams
from lyre.errors import InvalidRequest
from lyre.service.options import SamplingOptions, parse
from tests.support.services import engine_state, run, service

NAMES = list(SamplingOptions.model_fields)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30) | st.floats()
    | st.sampled_from([10**400, -(10**400), 2**63, 2**63 - 1, 0, 1, 0.5, 1e-12, 1.0]) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=5,
)


@settings(max_examples=600, derandomize=True)
@given(name=st.sampled_from(NAMES), value=JSON)
def test_any_json_value_is_refused_or_valid_for_the_engine(name, value):
    try:
        options = parse(SamplingOptions, {name: value})
    except InvalidRequest as e:
        assert f"'{name}'" in str(e) and len(str(e)) < 300
        return
    accepted = getattr(options, name)
    if accepted is None:
        return
    assert type(accepted) in (int, float) and math.isfinite(accepted)
    SamplingParams.from_config(SamplingConfig(), **options.sampling()).validate()  # what the engine checks


def test_the_request_options_take_their_sampling_limits_from_the_config():
    for name in ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "min_tokens", "seed"):
        assert limits_of(SamplingOptions, name) == limits_of(SamplingConfig, name) != {}
    try:
        load_config(None, {"sampling.top_p": 0})
    except ValueError as e:
        assert "sampling.top_p" in str(e) and "must be >= 0.001 and <= 1.0" in str(e)
    else:
        raise AssertionError("top_p = 0 was accepted")


def test_through_the_service_nothing_invalid_reaches_the_engine_thread():
    """The same property end to end: a refused value raises at once; an accepted one gives audio;
    afterwards the engine loop is alive and holds nothing."""
    outcomes = []

    async def go():
        async with service(**{"sampling.max_tokens": 14}) as tts:
            @settings(max_examples=60, derandomize=True, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])
            @given(name=st.sampled_from(NAMES), value=JSON)
            def probe(name, value):
                outcomes.append((name, value))

            probe()  # collect the examples, then run them on this event loop
            results = []
            for name, value in outcomes:
                if name == "max_tokens" and isinstance(value, int) and not isinstance(value, bool) and value > 14:
                    value = 14  # keep accepted examples short
                try:
                    stream = tts.stream("hi", **{name: value})
                except InvalidRequest:
                    results.append("refused")
                    continue
                first = await anext(stream, None)
                await stream.aclose()
                results.append("spoke" if first is not None or name == "max_tokens" else "silent")
            return results, tts.ready, await engine_state(tts)

    results, ready, state = run(go())
    assert "refused" in results and "spoke" in results and "silent" not in results
    assert ready and state["gate"] == 0 and state["engine_active"] == 0
