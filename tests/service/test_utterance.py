"""``tts.utterance()``: text arriving in pieces, spoken in order as one stream (library API)."""

from __future__ import annotations

import pytest

from lyre.errors import ControlTokenInText, InvalidRequest, OutOfRange, UnknownVoice
from lyre.model import orpheus
from lyre.service.text import SentenceStream
from tests.support.services import engine_state, run, service

PIECE_SAMPLES = 6 * orpheus.SAMPLES_PER_FRAME  # each piece: 42 tokens = 6 frames


async def speak(tts, u, appends: list[str]) -> tuple[list, list[int]]:
    """Append word by word as an LLM would, end, and read every chunk; also the admission places
    held at each chunk."""
    for text in appends:
        u.append(text)
    u.end()
    chunks, inside = [], []
    async for chunk in u:
        chunks.append(chunk)
        inside.append(tts.gate.inside)
    return chunks, inside


def test_pieces_are_spoken_in_order_with_one_generating_ahead():
    text = "Sure, I can help. Dr. Smith said \"Call at 5 p.m.\" Then he left! Anything else?"

    async def go():
        async with service() as tts, tts.utterance(voice="tara", seed=2) as u:
            chunks, inside = await speak(tts, u, [w + " " for w in text.split(" ")])
            return u.pieces, u.metrics, chunks, inside, await engine_state(tts)

    pieces, metrics, chunks, inside, state = run(go())
    assert pieces == ["Sure,", "I can help.", 'Dr. Smith said "Call at 5 p.m."', "Then he left!", "Anything else?"]
    assert sum(len(c.pcm) for c in chunks) == len(pieces) * PIECE_SAMPLES
    assert [c.index for c in chunks] == list(range(len(chunks)))
    offsets = [c.offset_samples for c in chunks]
    assert offsets == [sum(len(c.pcm) for c in chunks[:i]) for i in range(len(chunks))]  # one timeline
    assert max(inside) == 2  # the piece heard and one ahead, never more
    assert metrics.pieces == len(pieces) and metrics.tokens == 42 * len(pieces) and metrics.ttfb_ms > 0
    assert state["gate"] == 0 and state["engine_active"] == 0 and state["codec_states"] == 0


def test_a_long_append_is_split_to_the_profile_limit_and_never_floods_admission():
    sentence = "This sentence is here to make the text long enough. "
    text = sentence * 12  # ~620 characters in one append

    async def go():
        # one active place and no queue: a piece ahead is refused, then spoken when the first ends
        async with service(**{"scheduler.max_concurrent_sessions": 1, "scheduler.max_batch_size": 1,
                              "scheduler.max_pending": 0}) as tts, tts.utterance() as u:
            chunks, inside = await speak(tts, u, [text])
            return u.pieces, chunks, inside

    pieces, chunks, inside = run(go())
    # 11 complete sentences packed into pieces of <= 250 characters; the 12th waits for text after it
    assert len(pieces) == 4 and all(len(p) <= 250 for p in pieces)
    assert " ".join(pieces) == text.strip()
    assert max(inside) == 1 and sum(len(c.pcm) for c in chunks) == 4 * PIECE_SAMPLES


def test_bad_appends_are_refused_and_change_nothing():
    async def go():
        async with service(**{"server.max_pending_text_chars": 100}) as tts:
            with pytest.raises(UnknownVoice):
                tts.utterance(voice="bob")
            with pytest.raises(InvalidRequest, match="'top_k' must be an integer"):
                tts.utterance(top_k=1.5)
            u = tts.utterance(seed=1)
            u.append("no punctuation yet and ")
            before = u.pending_chars
            with pytest.raises(InvalidRequest, match="server.max_pending_text_chars is 100"):
                u.append("x" * 90)
            with pytest.raises(InvalidRequest, match="appended text must be a string"):
                u.append(7)
            with pytest.raises(InvalidRequest, match="lone surrogate"):
                u.append("bad \udc00 half")
            # text the tokenizer reads as a control token, alone or completed by this append, is refused
            with pytest.raises(ControlTokenInText, match=r"'<\|eot_id\|>' at characters 4-14, which the model reads"):
                u.append("say <|eot_id|> now")
            assert u.pending_chars == before
            u.append("<custom_tok")  # half of one: harmless alone
            with pytest.raises(ControlTokenInText, match="with the end of the text before it, contains '<custom_token_5>'"):
                u.append("en_5> more")
            u.append("en of nothing ")  # the utterance goes on
            before = u.pending_chars
            u.append("a smile \ud83d")  # an emoji split between two appends (UTF-16 halves) is joined
            u.append("\ude00 here.")
            u.end()
            with pytest.raises(InvalidRequest, match="has ended"):
                u.append("more")
            chunks = [c async for c in u]
            return u.pieces, chunks, tts.gate.inside

    pieces, chunks, inside = run(go())
    assert pieces == ["no punctuation yet and <custom_token of nothing a smile \U0001f600 here."]
    assert sum(len(c.pcm) for c in chunks) == PIECE_SAMPLES and inside == 0


def test_a_piece_that_can_never_run_is_refused_and_the_pieces_after_it_are_spoken():
    """max_tokens fits a short piece's slot but not a long one's: the append that completed the long
    piece gets the error, and the utterance goes on without it."""
    long = "This sentence is long enough that its prompt leaves less room than max tokens asks for"

    async def go():
        async with service(**{"kv_cache.max_seq_len": 96}) as tts:
            u = tts.utterance(max_tokens=64, min_tokens=42)
            u.append("Hi there.")
            u.flush()
            u.append(long + ".")
            with pytest.raises(OutOfRange, match="'max_tokens' = 64 is out of range"):
                u.flush()  # (the message that completed the piece)
            u.append("Bye now.")
            u.end()
            chunks = [c async for c in u]
            return u.pieces, chunks, await engine_state(tts)

    pieces, chunks, state = run(go())
    assert pieces == ["Hi there.", "Bye now."] and chunks
    assert state["active"] == state["pending"] == state["gate"] == 0 and state["free_slots"] == 8


def test_cancel_mid_utterance_frees_every_place():
    async def go():
        async with service(**{"sampling.max_tokens": 420}) as tts:
            u = tts.utterance(seed=1)
            u.append("Hello there, ")  # the first clause: one piece
            u.append("the second sentence is here. Third")  # a second piece, generating ahead
            first = await anext(u)
            assert tts.gate.inside == 2
            u.cancel()
            rest = [c async for c in u]
            return first, rest, await engine_state(tts)

    first, rest, state = run(go())
    assert len(first.pcm) > 0 and rest == []
    assert state["gate"] == 0 and state["engine_active"] == 0 and state["active"] == 0


def test_sentence_stream_rescans_only_the_unfinished_sentence():
    s = SentenceStream(max_chars=250)
    assert s.append("word " * 40) == [] and s.pending_chars == 200  # no punctuation: kept, not rescanned
    pieces = s.append("word " * 20)  # past the limit with no sentence end: spoken in limit-sized pieces
    assert pieces and all(len(p) <= 250 for p in pieces) and s.pending_chars < 250
    assert s.flush() and s.pending_chars == 0
