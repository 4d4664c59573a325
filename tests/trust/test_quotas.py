"""Per-account counters on the asyncio side: places (WebSocket contexts, enrollments, verifications)
are refused past the quota, naming it, and come back when released; characters per minute are
counted over a sliding minute of a controlled clock."""

from __future__ import annotations

import pytest

from lyre.config import load_config
from lyre.errors import QuotaExceeded, TextTooLong
from lyre.trust.quotas import Quotas
from tests.support.fakes import FakeClock


def test_places_are_refused_past_the_quota_and_come_back_once_released():
    refusals = []
    quotas = Quotas(load_config(None, {"accounts.quotas": {"a": {"max_enrollments": 2}}}), ("a", "b"),
                    on_refusal=lambda account, key: refusals.append((account, key)))
    first, second = quotas.take("a", "enrollments"), quotas.take("a", "enrollments")
    with pytest.raises(QuotaExceeded, match=r"account 'a' is at its quota: at most 2 enrollments in flight "
                                            r"\(accounts.max_enrollments\)"):
        quotas.take("a", "enrollments")
    assert refusals == [("a", "accounts.max_enrollments")]
    with quotas.hold("b", "enrollments"):  # another account's own places
        pass
    first()
    first()  # a second release changes nothing
    quotas.take("a", "enrollments")
    with pytest.raises(QuotaExceeded):
        quotas.take("a", "enrollments")
    second()


def test_characters_per_minute_slide_with_the_clock():
    clock = FakeClock()
    quotas = Quotas(load_config(None, {"accounts.default.chars_per_minute": 100}), ("a", "b"), clock=clock)
    quotas.charge_chars("a", 60)
    clock.advance(20)
    quotas.charge_chars("a", 40)
    with pytest.raises(QuotaExceeded, match="accounts.chars_per_minute") as refused:
        quotas.charge_chars("a", 30)
    assert refused.value.retry_after_s == pytest.approx(40)  # when the first 60 leave the minute
    quotas.charge_chars("b", 100)  # another account's minute is its own
    clock.advance(40)
    quotas.charge_chars("a", 30)
    with pytest.raises(TextTooLong, match="at most 100 a minute"):
        quotas.charge_chars("a", 101)  # can never fit: not a wait
