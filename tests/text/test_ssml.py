"""The SSML subset (issue 32): what each tag makes of the caller's text, where each character came
from in the document, the segments a document is cut into, and the documents that are refused
(each with a message naming the problem), hostile ones within bounded time."""

from __future__ import annotations

import pytest

from lyre.errors import InvalidRequest
from lyre.service.said import from_ssml
from lyre.text.ssml import MAX_DEPTH, SsmlError, is_ssml, parse, say_as


def said(doc: str, normalization: str | None = None, language: str | None = None, max_chars: int = 280) -> list:
    return from_ssml(parse(doc), max_chars, language, normalization)


def test_every_character_of_every_run_points_at_itself_in_the_document():
    doc = ('<speak>Dear <emphasis>Ms.</emphasis> Ortiz,&#10;your code is <say-as interpret-as="characters">'
           'AB7</say-as>. Caf&#xE9; &amp; bar <!-- a note --> at 9<break/>am.</speak>')
    runs = parse(doc).runs
    for run in runs:
        for ch, at in zip(run.text, run.places, strict=True):
            assert doc[at] == ch or doc[at] == "&"  # (a reference: its first character)
    assert "".join(r.text for r in runs) == "Dear Ms. Ortiz,\nyour code is AB7. Café & bar  at 9am."


def test_each_tag_reads_as_the_table_in_the_docs_says():
    segments = said('<speak>Call <say-as interpret-as="telephone">+1 415 555 0100</say-as> about '
                    '<sub alias="World Wide Web">WWW</sub> order <say-as interpret-as="digits">4471</say-as>, '
                    'the <say-as interpret-as="ordinal">3</say-as> time, on <say-as interpret-as="date" format="dmy">'
                    '03/04/2027</say-as>.<laugh/></speak>')
    assert [s.spoken for s in segments] == [
        "Call plus one, four one five, five five five, zero one zero zero about World Wide Web order four four seven "
        "one, the third time, on the third of April, twenty twenty-seven. <laugh>"]
    assert segments[0].text == "Call +1 415 555 0100 about WWW order 4471, the 3 time, on 03/04/2027."


@pytest.mark.parametrize(("kind", "text", "fmt", "expected"), [
    ("characters", "AB-7", "", "A B dash seven"),
    ("spell-out", "lyre", "", "L Y R E"),
    ("cardinal", "1,234", "", "one thousand two hundred thirty-four"),
    ("cardinal", "-12.5", "", "minus twelve point five"),
    ("ordinal", "21", "", "twenty-first"),
    ("digits", "2027", "", "two zero two seven"),
    ("date", "2027-04-03", "ymd", "April third, twenty twenty-seven"),
    ("date", "04/2027", "my", "April, twenty twenty-seven"),
    ("date", "1999", "y", "nineteen ninety-nine"),
    ("time", "9:30pm", "", "nine thirty p m"),
    ("currency", "$12.50", "", "twelve dollars and fifty cents"),
    ("cardinal", "lots", "", "lots"),  # (not a number: read as written)
])
def test_say_as(kind, text, fmt, expected):
    assert say_as(kind, text, fmt) == expected


def test_a_document_is_cut_at_breaks_paragraphs_and_rate_changes_with_the_silence_around_them():
    segments = said('<speak>One.<break time="750ms"/>Two <prosody rate="slow">three</prosody>'
                    '<p>Four.</p><p><s>Five.</s><s>Six.</s></p><break strength="strong"/></speak>')
    assert [(s.text, s.pause_before_s, s.pause_after_s, s.rate) for s in segments] == [
        ("One.", 0.0, 0.0, 1.0), ("Two", 0.75, 0.0, 1.0), ("three", 0.0, 0.0, 0.8), ("Four.", 0.0, 0.0, 1.0),
        ("Five. Six.", 0.5, 0.7, 1.0)]  # (sentences pack together, as plain text's do)


def test_what_a_document_makes_the_model_read_is_bounded_and_charged():
    with pytest.raises(InvalidRequest, match="at most 64 are accepted"):
        said("<speak>" + "".join(f"w{i}<break time='10ms'/>" for i in range(100)) + "</speak>")
    with pytest.raises(InvalidRequest, match="reads as 1000 characters; at most 280"):
        said('<speak><sub alias="' + "a" * 1000 + '">x</sub></speak>')
    assert len(said("<speak>" + "<s>a.</s>" * 500 + "</speak>")) == 4  # (packed, not a segment each)
    nested = said('<speak>a <sub alias="one"><p>1</p></sub> b</speak>')  # (nothing inside a sub escapes it)
    assert [(s.spoken, s.pause_before_s) for s in nested] == [("a one b", 0.0)]
    with pytest.raises(SsmlError, match="<audio> is not one Lyre reads"):
        parse('<speak><say-as interpret-as="digits"><audio/>1</say-as></speak>')
    assert say_as("digits", "x²3") == "three" and say_as("cardinal", "9" * 5000).startswith("nine nine")


def test_long_text_is_cut_at_sentence_ends_and_every_segment_fits():
    sentence = "The quick brown fox jumps over the lazy dog again and again. "
    segments = said(f"<speak>{sentence * 12}</speak>", max_chars=140)
    assert all(len(s.text) <= 140 for s in segments) and len(segments) >= 6
    assert all(s.text.endswith(".") for s in segments)
    assert " ".join(s.text for s in segments) == (sentence * 12).strip()


def test_plain_text_is_normalised_as_the_request_says_and_marked_text_always_as_marked():
    doc = '<speak>Pay $5 by <say-as interpret-as="date" format="mdy">3/4/2027</say-as>.</speak>'
    assert said(doc)[0].spoken == "Pay five dollars by March fourth, twenty twenty-seven."
    assert said(doc, "off")[0].spoken == "Pay $5 by March fourth, twenty twenty-seven."
    day_first = '<speak><lang xml:lang="en-GB">On 03/04/2027.</lang> On 03/04/2027.</speak>'
    assert [s.spoken for s in said(day_first)] == ["On April third, twenty twenty-seven.",
                                                   "On March fourth, twenty twenty-seven."]
    assert [s.language for s in said(day_first)] == ["en-GB", None]


def test_what_starts_a_document():
    assert is_ssml("<speak>Hi</speak>") and is_ssml("  \n<speak xml:lang='en-US'>Hi</speak>")
    assert is_ssml('<?xml version="1.0"?><speak>Hi</speak>') and is_ssml("<!DOCTYPE speak><speak/>")
    assert not is_ssml("<laugh> Hi") and not is_ssml("Say <speak> aloud") and not is_ssml("<speaker>")


@pytest.mark.parametrize(("doc", "message"), [
    ("<speak><audio src='x.wav'/>Hi</speak>", "SSML tag <audio> is not one Lyre reads"),
    ("<speak>Hi", "not well-formed XML: no element found"),
    ("<speak>Hi</speek>", "not well-formed XML: mismatched tag: line 1"),
    ("<speak>&nbsp;</speak>", "undefined entity"),
    ('<!DOCTYPE speak [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]><speak>&lol2;</speak>',
     "may not declare a document type"),
    ('<!DOCTYPE speak SYSTEM "file:///etc/passwd"><speak>x</speak>', "may not declare a document type"),
    ('<speak>\n\n<break time="2 hours"/></speak>', "<break time='2 hours'>: write a length such as 500ms or 2s (line 3)"),
    ('<speak><break time="11s"/></speak>', "at most 10 s"),
    ('<speak><break strength="loud"/></speak>', "<break strength='loud'>: takes none, x-weak"),
    ("<speak>" + '<break time="10s"/>' * 7 + "x</speak>", "more than 60 s of silence"),
    ('<speak><prosody rate="5%">x</prosody></speak>', "between 0.5 and 2 times"),
    ('<speak><say-as interpret-as="vulgar">x</say-as></speak>', "<say-as interpret-as='vulgar'>: takes characters"),
    ("<speak><sub>x</sub></speak>", "<sub> needs an alias attribute"),
    ("<speak><lang>x</lang></speak>", "<lang> needs an xml:lang attribute"),
    ("<p>Hi</p>", "root element must be <speak>"),
    ("<speak><![CDATA[<b>]]></speak>", "CDATA sections are not accepted"),
    ('<speak><sub alias="' + "a" * 2000 + '">x</sub></speak>', "has 2000 characters; at most 1024"),
    ("<speak>" + "<s>" * (MAX_DEPTH + 5) + "x" + "</s>" * (MAX_DEPTH + 5) + "</speak>", "nests deeper than 32"),
    ("<speak>" + "<emphasis/>" * 2100 + "</speak>", "more than 2000 elements"),
    ("<speak>\ud800</speak>", "lone surrogate"),
])
def test_a_document_lyre_does_not_read_is_refused_naming_why(doc, message):
    with pytest.raises(SsmlError) as e:
        parse(doc)
    assert message in str(e.value)


def test_lenient_parsing_reads_an_unknown_tag_as_its_text():
    doc = parse('<speak>Hello <mark name="a"/><amazon:effect xmlns:amazon="x">there</amazon:effect>.</speak>',
                lenient=True)
    assert doc.text == "Hello there." and doc.unknown == ["mark", "{x}effect"]


def test_a_document_with_nothing_to_say_is_refused():
    with pytest.raises(InvalidRequest, match="no text to speak"):
        said('<speak><break time="1s"/> <!-- nothing --></speak>')


@pytest.mark.timeout(60)
@pytest.mark.parametrize("doc", [
    "<speak>" + "<s>" * 200_000 + "x",  # deep: refused at depth 33, not parsed to the end
    "<speak>" + "1" * 1_000_000 + "</speak>",  # a megabyte of digits
    "<speak>" + "&amp;" * 200_000 + "</speak>",
    "<speak>" + "a&#8203;" * 100_000 + "</speak>",  # zero-width spaces
    "<speak>" + "שלום עולם " * 50_000 + "Hello</speak>",  # right-to-left and Latin mixed
    "<speak>" + "<" * 100_000,
    '<speak><sub alias="' + '"' * 100_000,
])
def test_hostile_documents_end_in_bounded_time_with_a_result_or_a_clear_error(doc):
    try:
        out = parse(doc)
    except SsmlError as e:
        assert str(e)
    else:
        assert out.runs
