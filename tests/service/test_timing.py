"""Timestamps: where each spoken piece lies in the caller's text and, to the sample, in the stream's
audio; estimated words; what a listener heard when it stopped (lyre.service.timing)."""

from __future__ import annotations

from lyre.model.orpheus import SAMPLE_RATE
from lyre.service.timing import KEPT, Timeline
from tests.support.services import run, service


def test_pieces_are_found_in_the_callers_text_and_placed_in_the_audio():
    text = "Hello   there,\n how are you?  <laugh> Fine."
    t = Timeline()
    t.add_text(text)
    for key, piece in enumerate(["Hello there,", "how are you?", "<laugh> Fine."]):
        t.expect(key, piece)
    t.audio(0, 100)
    t.audio(0, 50, last=True)
    assert [p.text for p in t.take()] == ["Hello there,"]
    t.audio(1, 200)
    assert t.take() == []  # not finished: its end is not known yet
    t.audio(2, 300)  # a chunk of the next piece ends the one before it
    t.finish()
    pieces = t.take()
    assert [(p.start_sample, p.end_sample) for p in pieces] == [(150, 350), (350, 650)]
    for p in t.pieces:  # offsets into the caller's text, whitespace as sent
        assert text[p.start_char:p.end_char].split() == p.text.split()
    words = t.pieces[2].words()
    assert [w.text for w in words] == ["Fine."]  # the tag takes time but is no word
    assert t.pieces[2].start_s < words[0].start_s < words[0].end_s == t.pieces[2].end_s


def test_long_runs_of_spaces_and_refused_pieces_never_lose_the_place_in_the_text():
    text = "\n" * 70 + "Hello there." + " " * 100 + "Refused piece." + "\t" * 80 + "Next one."
    t = Timeline()
    t.add_text(text)
    t.expect(0, "Hello there.")
    t.skip("Refused piece.")  # never spoken: passed over
    t.expect(1, "Next one.")
    t.audio(0, 10, last=True)
    t.audio(1, 10, last=True)
    assert [text[p.start_char:p.end_char] for p in t.take()] == ["Hello there.", "Next one."]


def test_a_long_stream_keeps_only_its_last_pieces_and_its_pace():
    t = Timeline()
    for i in range(KEPT + 10):
        t.add_text(f"Piece {i}. ")
        t.expect(i, f"Piece {i}.")
        t.audio(i, 2400, last=True)
    assert len(t.take()) == KEPT and len(t.pieces) == KEPT and t.pieces[-1].index == KEPT + 9
    heard = t.heard(0.1 * (KEPT + 10))
    assert heard.pieces[-1].text == f"Piece {KEPT + 9}." and len(heard.pieces) == KEPT


def test_words_share_the_piece_by_syllables_and_never_leave_it():
    t = Timeline()
    t.add_text("I understand completely, thanks.")
    t.expect(0, "I understand completely, thanks.")
    t.audio(0, SAMPLE_RATE * 2, last=True)
    (piece,) = t.take()
    words = piece.words()
    assert [w.text for w in words] == ["I", "understand", "completely,", "thanks."]
    assert words[0].start_s == 0.0 and abs(words[-1].end_s - 2.0) < 1e-9
    assert all(a.end_s <= b.start_s for a, b in zip(words, words[1:], strict=False))  # in order, a pause after the comma
    assert words[1].end_s - words[1].start_s > words[0].end_s - words[0].start_s  # 3 syllables > 1
    body = piece.as_dict("chars", speed=2.0, sample_rate=8000)
    assert body["end_s"] == 1.0 and body["end_sample"] == 8000  # at the output's speed and rate
    assert body["word_timestamps"]["words"] == ["I", "understand", "completely,", "thanks."]
    chars = body["alignment"]
    assert "".join(chars["chars"]) == piece.text and len(chars["charStartTimesMs"]) == len(piece.text)
    assert chars["charStartTimesMs"] == sorted(chars["charStartTimesMs"])


def test_heard_gives_whole_pieces_then_estimated_words_and_how_much_text():
    text = "First one. Second piece is here."
    t = Timeline()
    t.add_text(text)
    t.expect(0, "First one.")
    t.expect(1, "Second piece is here.")
    t.audio(0, SAMPLE_RATE, last=True)
    t.audio(1, SAMPLE_RATE)  # the second is still being generated
    nothing = t.heard(0.0)
    assert nothing.pieces == [] and nothing.words == [] and nothing.end_char == 0
    first = t.heard(1.0)
    assert [p.text for p in first.pieces] == ["First one."] and text[:first.end_char] == "First one."
    later = t.heard(1.9)  # inside the unfinished piece: its words estimated at the pace of the first
    assert [p.text for p in later.pieces] == ["First one."]
    assert later.words and later.words[0].text == "Second"
    assert text[:later.end_char].endswith(later.words[-1].text)
    assert all(w.end_s <= 1.9 for w in later.words)
    body = later.as_dict(sent_s=2.0)
    assert body["sent_s"] == 2.0 and body["words"]["estimated"] is True


def test_a_long_text_gets_exact_spans_through_the_library():
    sentence = "This sentence is here to make the text long enough to split. "
    text = sentence * 7

    async def go():
        async with service() as tts:
            stream = tts.speak(text, voice="tara", seed=3)
            chunks, pieces = [], []
            async for chunk in stream:
                chunks.append(chunk)
                pieces += stream.timeline.take()
            return chunks, pieces + stream.timeline.take(), stream.timeline

    chunks, pieces, timeline = run(go())
    assert len(pieces) >= 2
    assert [p.index for p in pieces] == list(range(len(pieces)))
    assert pieces[0].start_sample == 0 and pieces[-1].end_sample == sum(len(c.pcm) for c in chunks)
    assert all(a.end_sample == b.start_sample for a, b in zip(pieces, pieces[1:], strict=False))  # no gap, no overlap
    for p in pieces:
        assert text[p.start_char:p.end_char].split() == p.text.split()
    assert pieces[-1].end_char == len(text.rstrip())
    assert timeline.heard(pieces[-1].end_s).pieces == pieces


def test_an_utterance_places_pieces_across_its_appends():
    text = "Sure, I can help. Then he left! Anything else?"

    async def go():
        async with service() as tts, tts.utterance(voice="tara", seed=2) as u:
            for word in text.split(" "):
                u.append(word + " ")
            u.end()
            starts, pieces = {}, []
            async for chunk in u:
                for p in u.timeline.take():
                    pieces.append(p)
                    starts[p.index] = chunk.offset_samples + len(chunk.pcm)
            return pieces + u.timeline.take(), starts

    pieces, ends_at = run(go())
    assert [p.text for p in pieces] == ["Sure,", "I can help.", "Then he left!", "Anything else?"]
    assert [text[p.start_char:p.end_char] for p in pieces] == ["Sure,", "I can help.", "Then he left!",
                                                                "Anything else?"]
    assert all(a.end_sample == b.start_sample for a, b in zip(pieces, pieces[1:], strict=False))
    for index, end in ends_at.items():  # handed out with its last chunk, not later
        assert pieces[index].end_sample == end
