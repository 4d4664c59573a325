"""English text normalisation (issue 32): every sentence of the call-centre corpus is said as
written in ``corpus_en.py``, exactly; the caller's characters stay the source of every span."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lyre.text import normalize
from lyre.text.corpus_en import CORPUS
from lyre.text.english import English

ENGLISH = English()


def test_the_corpus_is_large_and_every_sentence_in_it_once():
    assert len(CORPUS) >= 200 and len({written for written, _ in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize(("written", "said"), CORPUS, ids=[w[:40] for w, _ in CORPUS])
def test_a_sentence_is_said_as_a_person_would_say_it(written, said):
    assert ENGLISH.normalize(written).text == said


def test_every_part_of_what_is_said_maps_back_to_the_callers_characters():
    written = "Hi Dr. Lee, pay $1,234.50 by 03/04/2027 or call (415) 555-0100."
    out = normalize(written)
    for phrase, source in (("Doctor", "Dr."), ("one thousand two hundred thirty-four dollars and fifty cents",
                                                "$1,234.50"),
                           ("March fourth, twenty twenty-seven", "03/04/2027"),
                           ("four one five, five five five, zero one zero zero", "(415) 555-0100"),
                           ("Hi", "Hi"), ("Lee", "Lee"), ("call", "call")):
        start = out.text.index(phrase)
        a, b = out.source_span(start, start + len(phrase))
        assert written[a:b] == source, phrase
    # a word inside an expansion maps to the whole of what was expanded
    start = out.text.index("thousand")
    assert written[slice(*out.source_span(start, start + len("thousand")))] == "$1,234.50"
    assert out.source_offset(len(out.text)) == len(written)


def test_text_it_has_no_rules_for_is_kept_as_written():
    for language in ("de", "german", "zh-CN"):
        out = normalize("Es kostet 5 € am 03/04/2027.", language)
        assert out.text == "Es kostet 5 € am 03/04/2027." and out.source_span(0, 2) == (0, 2)


def test_day_first_regions_read_dates_day_first():
    assert normalize("Due 03/04/2027.", "en-GB").text == "Due April third, twenty twenty-seven."
    assert normalize("Due 03/04/2027.", "en-US").text == "Due March fourth, twenty twenty-seven."
    assert normalize("Due 25/12/2027.", "en-US").text == "Due December twenty-fifth, twenty twenty-seven."


@given(st.text(alphabet=st.sampled_from(list("0123456789 .,-/:$%@#abcXYZ<>+()€°")), max_size=80))
@settings(max_examples=300, deadline=None)
def test_any_text_maps_back_into_itself_and_copied_text_is_unchanged(written):
    out = normalize(written)
    last = 0
    for p in out.pieces:
        assert 0 <= p.src_start <= p.src_end <= len(written) and p.src_start >= last
        last = p.src_end
        if p.copied:
            assert out.text[p.out_start:p.out_end] == written[p.src_start:p.src_end]
    assert "".join(out.text[p.out_start:p.out_end] for p in out.pieces) == out.text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hostile", ["a" * 200_000, "a-" * 100_000, "www." * 50_000, "1" * 1_000_000, "1-" * 100_000,
                                     "a.b+" * 50_000 + "@", "a1" * 100_000, "1/" * 50_000, "A1-" * 60_000,
                                     "$" * 100_000 + "1", "1:" * 50_000, "x@y." * 50_000],
                         ids=lambda h: f"{h[:8]}x{len(h)}")
def test_hostile_text_is_normalised_in_one_pass(hostile):
    """A rule never scans far from where it starts: text built to make a pattern backtrack over it
    again at every position is still one pass (quadratic work would take hours, not the timeout)."""
    out = normalize(hostile)
    assert out.source_offset(len(out.text)) == len(hostile)
