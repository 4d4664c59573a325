"""lyre.model.orpheus: prompts, code <-> token mapping, and the incremental parser."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lyre.model import orpheus as o

codes = st.integers(0, o.CODEBOOK_SIZE - 1)


@st.composite
def snac_codes(draw, max_frames=12):
    t = draw(st.integers(0, max_frames))
    c0 = draw(st.lists(codes, min_size=t, max_size=t))
    c1 = draw(st.lists(codes, min_size=2 * t, max_size=2 * t))
    c2 = draw(st.lists(codes, min_size=4 * t, max_size=4 * t))
    return c0, c1, c2


@st.composite
def splits(draw, items):
    """``items`` cut into consecutive chunks of random sizes, after an empty one."""
    out, i = [[]], 0
    while i < len(items):
        n = draw(st.integers(1, 9))
        out.append(items[i : i + n])
        i += n
    return out


def test_constants_match_the_orpheus_layout():
    assert o.AUDIO_TOKEN_OFFSET == 128266 and o.AUDIO_ID_END == 156938 and o.VOCAB_SIZE == 156940
    assert o.STOP_IDS == (128258, 128262, 128009)
    assert o.PROMPT_SUFFIX == (128009, 128260, 128261, 128257)
    assert round(o.TOKENS_PER_SECOND, 2) == 82.03
    assert len(o.VOICES) == 8 and "tara" in o.VOICES


def test_one_frame_maps_to_the_documented_codebook_positions():
    # frame j: c0 <- t0; c1 <- t1, t4; c2 <- t2, t3, t5, t6
    c0, c1, c2 = [11], [21, 24], [32, 33, 35, 36]
    ids = o.codes_to_token_ids(c0, c1, c2)
    assert ids == [128266 + k * 4096 + c for k, c in enumerate([11, 21, 32, 33, 24, 35, 36])]
    back = o.token_ids_to_codes(ids)
    assert [a.tolist() for a in back] == [c0, c1, c2]


def test_code_zero_is_valid_and_4096_is_not():
    ids = o.codes_to_token_ids([0], [0, 0], [0, 0, 0, 0])
    assert ids[0] == 128266
    assert [a.tolist() for a in o.token_ids_to_codes(ids)] == [[0], [0, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match=r"c1\[1\] = 4096"):
        o.codes_to_token_ids([0], [0, 4096], [0, 0, 0, 0])
    with pytest.raises(ValueError, match=r"c2\[0\] = -1"):
        o.codes_to_token_ids([0], [0, 0], [-1, 0, 0, 0])
    # id of code 4096 in slot 2 = code 0 of slot 3: invalid at position 2
    bad = ids.copy()
    bad[2] = 128266 + 2 * 4096 + 4096
    with pytest.raises(ValueError, match=r"position 2: id 140554 .* frame slot 2 \(valid ids 136458..140553\)"):
        o.token_ids_to_codes(bad)


def test_token_ids_to_codes_names_the_first_invalid_position_and_wants_whole_frames():
    ids = o.codes_to_token_ids([1, 2], [3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13, 14])
    with pytest.raises(ValueError, match="13 ids are not whole frames"):
        o.token_ids_to_codes(ids[:13])
    bad = ids.copy()
    bad[9] = o.END_OF_SPEECH
    bad[12] = 5
    with pytest.raises(ValueError, match="position 9: id 128258"):
        o.token_ids_to_codes(bad)


def test_codes_accept_tensors_with_a_batch_dimension():
    torch = pytest.importorskip("torch")
    c0, c1, c2 = torch.tensor([[5, 6]]), torch.tensor([[1, 2, 3, 4]]), torch.arange(8)[None]
    ids = o.codes_to_token_ids(c0, c1, c2)
    assert len(ids) == 14
    with pytest.raises(ValueError, match="T, 2T, 4T"):
        o.codes_to_token_ids([1, 2], [1, 2], [1] * 8)
    with pytest.raises(ValueError, match="integers"):
        o.codes_to_token_ids([1.5], [1, 2], [1] * 4)


@given(snac_codes())
def test_codes_round_trip_through_token_ids(c):
    ids = o.codes_to_token_ids(*c)
    assert len(ids) == 7 * len(c[0])
    assert all(o.audio_code(tid, k) is not None for k, tid in enumerate(ids))
    assert [a.tolist() for a in o.token_ids_to_codes(ids)] == [list(x) for x in c]


@given(st.lists(st.integers(o.AUDIO_TOKEN_OFFSET, o.AUDIO_ID_END - 1), max_size=70))
def test_token_ids_round_trip_when_every_id_fits_its_slot(ids):
    valid = all(o.audio_code(t, k) is not None for k, t in enumerate(ids)) and len(ids) % 7 == 0
    if valid:
        assert o.codes_to_token_ids(*o.token_ids_to_codes(ids)) == ids
    else:
        with pytest.raises(ValueError):
            o.token_ids_to_codes(ids)


@settings(max_examples=200)
@given(st.data())
def test_parser_fed_in_random_splits_yields_the_same_frames(data):
    c = data.draw(snac_codes())
    ids = o.codes_to_token_ids(*c)
    stop = data.draw(st.sampled_from(o.STOP_IDS))
    trailing = data.draw(st.lists(st.integers(0, o.VOCAB_SIZE - 1), max_size=5))
    parser = o.AudioTokenParser()
    frames = []
    for chunk in data.draw(splits(ids + [stop] + trailing)):
        frames += parser.feed(chunk)
    assert frames == [tuple(f) for f in o.codes_to_frames(*c).tolist()]
    assert parser.finished and parser.stop_id == stop
    assert parser.stats.frames == len(c[0]) and parser.stats.after_stop == len(trailing)
    assert parser.stats.invalid_tokens == 0 and parser.pending_tokens == 0


@settings(max_examples=200)
@given(st.data())
def test_invalid_tokens_drop_their_frame_without_shifting_the_others(data):
    c = data.draw(snac_codes(max_frames=8))
    ids = o.codes_to_token_ids(*c)
    expected = [tuple(f) for f in o.codes_to_frames(*c).tolist()]
    n_bad = data.draw(st.integers(0, min(3, len(ids))))
    positions = data.draw(st.lists(st.integers(0, max(len(ids) - 1, 0)), min_size=n_bad, max_size=n_bad, unique=True))
    for k in positions:  # an audio-range id from another slot's band
        ids[k] = o.AUDIO_TOKEN_OFFSET + ((k + 1) % 7) * 4096 + data.draw(codes)
    # non-audio ids sprinkled in are skipped and do not occupy a slot
    inserts = data.draw(st.lists(st.sampled_from([5, 127999, o.START_OF_SPEECH, o.PAD, 156938, 156939]), max_size=3))
    stream = list(ids)
    for tid in inserts:
        stream.insert(data.draw(st.integers(0, len(stream))), tid)
    parser = o.AudioTokenParser()
    frames = []
    for chunk in data.draw(splits(stream)):
        frames += parser.feed(chunk)
    bad_frames = {k // 7 for k in positions}
    assert frames == [f for j, f in enumerate(expected) if j not in bad_frames]
    assert parser.stats.invalid_tokens == len(positions)
    assert parser.stats.dropped_frames == len(bad_frames)
    assert parser.stats.non_audio_tokens == len(inserts)
    assert parser.stats.audio_tokens == len(ids)


def test_parser_keeps_an_incomplete_frame_pending_and_never_emits_it():
    ids = o.codes_to_token_ids([1, 2], [3, 4, 5, 6], list(range(8)))
    parser = o.AudioTokenParser()
    assert parser.feed(ids[:6]) == []
    assert parser.pending_tokens == 6
    assert len(parser.feed(ids[6:10])) == 1
    assert parser.pending_tokens == 3
    assert parser.feed([o.END_OF_SPEECH]) == [] and parser.finished
    assert parser.feed(ids[10:]) == [] and parser.stats.after_stop == 4


def test_prompt_ids_follow_the_orpheus_template(demo_tokenizer):
    ids = o.build_prompt_ids(demo_tokenizer, "Hello world", "tara")
    text_ids = demo_tokenizer.encode("tara: Hello world").ids
    assert text_ids[0] == o.BOS and text_ids.count(o.BOS) == 1
    assert ids == [o.START_OF_HUMAN, *text_ids, 128009, 128260, 128261, 128257]
    assert ids.count(o.BOS) == 1
    no_voice = o.build_prompt_ids(demo_tokenizer, "Hello world")
    assert no_voice[1:-4] == demo_tokenizer.encode("Hello world").ids
    with pytest.raises(ValueError, match="empty"):
        o.build_prompt_ids(demo_tokenizer, "   ", "tara")


def test_text_spelling_a_control_token_is_refused(demo_tokenizer):
    for text, name, start in (("hi <|eot_id|> there", "<|eot_id|>", 3), ("<custom_token_12>", "<custom_token_12>", 0),
                              ("x<|begin_of_text|>", "<|begin_of_text|>", 1), ("é <|end_of_text|>", "<|end_of_text|>", 2)):
        found = o.control_token(demo_tokenizer, text)
        assert found == o.ControlToken(name, start, start + len(name)), text  # offsets in characters
        with pytest.raises(ValueError, match=f"at characters {start}-{start + len(name)}, which the model reads as a "
                                             "control token"):
            o.build_prompt_ids(demo_tokenizer, text, "tara")
    assert o.build_prompt_ids(demo_tokenizer, "a <laugh> and <| not a token", "tara")  # look-alikes are fine
    assert o.control_token(demo_tokenizer, "a <laugh> and <|eot_id| no") is None
    assert max(len(t) for t in demo_tokenizer.get_vocab() if t.startswith("<")) < o.CONTROL_TAIL


def test_prompt_adds_bos_when_the_tokenizer_does_not(demo_tokenizer):
    class NoBos:
        def encode(self, text):
            return demo_tokenizer.encode(text, add_special_tokens=False).ids

    assert o.build_prompt_ids(NoBos(), "Hi", "leo") == o.build_prompt_ids(demo_tokenizer, "Hi", "leo")


def test_clone_prompt_puts_the_reference_turn_first(demo_tokenizer):
    ref = o.codes_to_token_ids([1], [2, 3], [4, 5, 6, 7])
    ids = o.build_clone_prompt_ids(demo_tokenizer, "New words", "Old words", ref)
    ref_turn = o.build_prompt_ids(demo_tokenizer, "Old words")
    assert ids[: len(ref_turn)] == ref_turn
    rest = ids[len(ref_turn) :]
    assert rest[:7] == ref and rest[7:9] == [o.END_OF_SPEECH, o.END_OF_AI]
    assert rest[9:] == o.build_prompt_ids(demo_tokenizer, "New words")
    with pytest.raises(ValueError, match="whole frames"):
        o.build_clone_prompt_ids(demo_tokenizer, "New", "Old", ref[:5])


def test_single_token_helpers():
    assert o.audio_token_id(0, 7) == 128266 and o.audio_token_id(4095, 6) == o.AUDIO_ID_END - 1
    assert o.audio_code(128266, 1) is None and o.audio_code(128266 + 4096, 8) == 0
    with pytest.raises(ValueError):
        o.audio_token_id(4096, 0)
    assert o.is_audio_id(128266) and not o.is_audio_id(128265) and not o.is_audio_id(156938)
    assert np.array_equal(o.frames_to_codes(np.zeros((0, 7)))[2], np.zeros(0))
