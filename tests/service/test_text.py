"""Splitting long input into segments."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from lyre.model.orpheus import EMOTION_TAGS
from lyre.service.text import split_text

words = st.sampled_from(["hello", "world", "a", "caller", "Tuesday,", "ok.", "really?", "yes!", "and;", "well:",
                         *EMOTION_TAGS, "supercalifragilisticexpialidocious"])


@given(st.lists(words, max_size=300), st.integers(20, 300))
def test_segments_are_bounded_ordered_and_lose_nothing(tokens, limit):
    text = " ".join(tokens)
    segments = split_text(text, limit)
    assert " ".join(segments) == " ".join(text.split())
    for seg in segments:
        assert len(seg) <= limit or " " not in seg  # only a single over-long word may exceed it
        for tag in re.findall(r"<[^>]*>?|<?[^<]*>", seg):
            assert tag in EMOTION_TAGS or "<" not in tag  # tags are never cut


def test_sentence_then_clause_then_word_boundaries():
    sentences = "The first sentence is here. The second one follows! Is there a third? Yes."
    assert split_text(sentences, 40) == ["The first sentence is here.", "The second one follows!",
                                         "Is there a third? Yes."]
    clauses = "one two three, four five six; seven eight nine: ten"
    assert split_text(clauses, 20) == ["one two three,", "four five six;", "seven eight nine:", "ten"]
    assert split_text("alpha beta gamma delta", 11) == ["alpha beta", "gamma delta"]
    assert split_text("Well <laugh> that was fun. Really <sigh> it was.", 30) == [
        "Well <laugh> that was fun.", "Really <sigh> it was."]
    assert split_text("   ") == [] and split_text("short") == ["short"]


def test_default_limit_is_about_280():
    text = "This sentence is exactly forty-one chars. " * 20
    assert all(len(s) <= 280 for s in split_text(text)) and len(split_text(text)) == 4


def test_closing_quotes_stay_with_their_sentence_when_long_text_is_split():
    text = 'He said "stop now." Then he left. (Really!") Yes. ' * 12
    segments = split_text(text, 100)
    assert len(segments) > 1
    assert " ".join(segments).split() == text.split()  # nothing dropped: every quote and bracket is spoken
