"""The kept prefix (a cloned voice's reference turn): computed once, copied into later slots; the
tokens and logits are those of a full prefill."""

from __future__ import annotations

import random

import pytest
import torch

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.torch.prefix_cache import PrefixCache
from lyre.model import orpheus
from tests.support.engines import drive, logits_of, make_engine, tokens_of

REFERENCE_FRAMES = 30  # 210 audio tokens: several prefill chunks of 64


def reference_turn(seed: int) -> list[int]:
    """[start_of_human] text [suffix] reference audio tokens [end_of_speech end_of_ai]."""
    rng = random.Random(seed)
    audio = [orpheus.audio_token_id(rng.randrange(4096), k) for k in range(7 * REFERENCE_FRAMES)]
    text = [orpheus.BOS] + [rng.randrange(1000, 5000) for _ in range(12)]
    return [orpheus.START_OF_HUMAN, *text, *orpheus.PROMPT_SUFFIX, *audio, orpheus.END_OF_SPEECH, orpheus.END_OF_AI]


def target(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [orpheus.START_OF_HUMAN, orpheus.BOS, *[rng.randrange(1000, 5000) for _ in range(9)], *orpheus.PROMPT_SUFFIX]


def request(rid: str, ref: list[int], text_seed: int, key: str | None) -> GenerationRequest:
    return GenerationRequest(rid, ref + target(text_seed), SamplingParams(temperature=0, max_tokens=21, min_tokens=21),
                             record_logits=True, prefix_key=key, prefix_len=len(ref) if key else 0)


@pytest.fixture
def engines(demo_dir):
    plain = make_engine(demo_dir / "llama", max_seq_len=512)
    kept = make_engine(demo_dir / "llama", max_seq_len=512, prefix_cache_bytes=64 * 2**20)
    return plain, kept


def test_a_kept_prefix_gives_the_tokens_and_logits_of_a_full_prefill(engines):
    plain, kept = engines
    ref = reference_turn(1)
    arrivals = {0: [request("a", ref, 10, None), request("b", ref, 11, None)], 30: [request("c", ref, 12, None)]}
    want = drive(plain, arrivals)
    arrivals = {0: [request("a", ref, 10, "voice-1"), request("b", ref, 11, "voice-1")],
                30: [request("c", ref, 12, "voice-1")]}
    got = drive(kept, arrivals)
    for rid in "abc":
        assert tokens_of(got[rid]) == tokens_of(want[rid])
        torch.testing.assert_close(logits_of(got[rid]), logits_of(want[rid]), rtol=1e-4, atol=1e-4)
    prompt = len(ref) + len(target(0))
    # a and b came together: each prefilled its own prompt; c found the prefix kept and prefilled only its text
    assert kept.prefilled_tokens == 2 * prompt + len(target(0)) and plain.prefilled_tokens == 3 * prompt
    assert kept.prompt_tokens == plain.prompt_tokens == 3 * prompt
    stats = kept.stats().extra
    assert stats["prefix_cache_entries"] == 1 and stats["prefix_cache_hits"] == 1


def test_prefixes_are_evicted_least_recently_used_first_within_the_budget(demo_dir):
    one = make_engine(demo_dir / "llama", max_seq_len=512, prefix_cache_bytes=64 * 2**20)
    drive(one, {0: [request("x", reference_turn(1), 1, "v1")]})
    entry_bytes = int(one.prefixes.bytes)
    e = make_engine(demo_dir / "llama", max_seq_len=512, prefix_cache_bytes=2 * entry_bytes + entry_bytes // 2)
    for i, key in enumerate(["v1", "v2", "v1", "v3"]):  # v1 used again before v3 arrives: v2 is the oldest
        drive(e, {0: [request(f"r{i}", reference_turn(int(key[1])), i, key)]})
    assert "v1" in e.prefixes and "v3" in e.prefixes and "v2" not in e.prefixes
    assert e.stats().extra["prefix_cache_evictions"] == 1 and e.prefixes.bytes <= e.prefixes.budget


def test_a_key_whose_ids_changed_is_a_miss_and_forget_prefix_drops_a_voice(demo_dir):
    e = make_engine(demo_dir / "llama", max_seq_len=512, prefix_cache_bytes=64 * 2**20)
    drive(e, {0: [request("a", reference_turn(1), 1, "v_abc:1")]})
    before = e.prefilled_tokens
    out = drive(e, {0: [request("b", reference_turn(2), 1, "v_abc:1")]})  # same key, other reference
    assert e.prefilled_tokens - before == len(reference_turn(2)) + len(target(1))  # computed anew, not reused
    assert len(tokens_of(out["b"])) == 21 and e.prefixes.holds("v_abc:1", reference_turn(2))  # the stale one replaced
    e.forget_prefix("v_abc:")
    assert len(e.prefixes) == 0 and e.prefixes.bytes == 0


def test_an_entry_larger_than_the_budget_is_not_kept():
    cache = PrefixCache(budget_bytes=100)
    k = torch.zeros(2, 2, 10, 4)
    assert not cache.put("big", range(10), k, k) and len(cache) == 0 and cache.bytes == 0
