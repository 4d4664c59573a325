"""Cloned voices through the library API on the demo checkpoint: enroll, speak, isolate, delete."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from lyre.errors import ConsentRequired, InvalidAudio, InvalidRequest, UnknownVoice
from lyre.model import orpheus
from tests.support.audio_files import audio_file, speechlike
from tests.support.servers import same_speech
from tests.support.services import run
from tests.support.services import service as small_service

CONSENT = {"granted": True, "speaker": "Ann Example", "source": "self_recorded", "statement": "I agree."}
TRANSCRIPT = "The quick brown fox jumps over the lazy dog."


def service(**overrides):
    """The test service, with slots long enough for cloned voices' reference turns."""
    return small_service(**{"kv_cache.max_seq_len": 4096, **overrides})


def clip(seconds: float = 4.0, seed: int = 0) -> bytes:
    return audio_file(speechlike(seconds, 44100, 2, seed=seed), 44100, "wav")


async def stats(tts) -> dict:
    await tts.on_engine_thread(lambda: None)
    return tts.stats().as_dict()["engine"]


def test_enrolled_voice_is_stored_with_its_reference_tokens_and_consent():
    async def go():
        async with service() as tts:
            v = await tts.voices.enroll(clip(4.0), name="Ann", transcript=f"  {TRANSCRIPT}  ", consent=CONSENT,
                                        account="alice", address="10.0.0.7")
            snac = tts.voices.cloning.snac
            stored = tts.voices.registry.audio(v.id, "alice")
            return v, await tts.voices.consent(v.id, "alice"), stored, snac

    v, consent, flac, snac = run(go())
    frames = -(-4 * 24000 // 2048)  # SNAC pads to whole frames of 2048 samples
    assert len(v.ref_token_ids) == 7 * frames and v.transcript == TRANSCRIPT and v.owner == "alice"
    assert consent["speaker"] == "Ann Example" and consent["source"] == "self_recorded" and consent["granted"] is True
    assert consent["account"] == "alice" and consent["address"] == "10.0.0.7" and len(consent["upload_sha256"]) == 64
    assert consent["statement"] == "I agree." and consent["time"].endswith("+00:00")
    # the tokens are SNAC's codes of the stored clip in Orpheus's frame order: decoding them is decoding those codes
    import io

    import soundfile as sf

    pcm, _ = sf.read(io.BytesIO(flac), dtype="float32")
    with torch.inference_mode():
        codes = snac.encode(torch.from_numpy(pcm)[None, None])
        c0, c1, c2 = orpheus.token_ids_to_codes(v.ref_token_ids)
        for mine, theirs in zip((c0, c1, c2), codes, strict=True):
            assert np.array_equal(mine, theirs[0].numpy())
        # (the demo's SNAC has random weights: its decode is noise, so "sounds like the clip" needs the real one)
        a = snac.decode([torch.from_numpy(c)[None] for c in (c0, c1, c2)])
        b = snac.decode(codes)
    assert torch.equal(a, b)


@pytest.mark.parametrize("consent, message", [
    (None, "needs a consent record"),
    ({"granted": False, "speaker": "Ann", "source": "self_recorded"}, "granted must be true"),
    ({"granted": True, "source": "self_recorded"}, "'speaker' is required"),
    ({"granted": True, "speaker": "Ann", "source": "found_online"}, "'source' must be"),
    ({"granted": "yes", "speaker": "Ann", "source": "self_recorded"}, "'granted' must be true or false"),
    ("yes", "must be a JSON object"),
])
def test_enrollment_without_a_granted_consent_record_is_refused_and_nothing_stored(consent, message):
    async def go():
        async with service() as tts:
            with pytest.raises(ConsentRequired, match=message):
                await tts.voices.enroll(clip(), name="Ann", transcript=TRANSCRIPT, consent=consent)
            return await tts.voices.list()

    assert run(go()) == []


@pytest.mark.parametrize("transcript, message", [
    ("", "'transcript' is required"), ("   ", "'transcript' is required"), (None, "'transcript' is required"),
    ("word " * 40, "more than a 4.0 s clip can hold"), ("hello <|eot_id|>", "control token"),
])
def test_a_transcript_that_cannot_be_the_clips_words_is_refused(transcript, message):
    async def go():
        async with service() as tts:
            with pytest.raises(InvalidRequest, match=message):
                await tts.voices.enroll(clip(4.0), name="Ann", transcript=transcript, consent=CONSENT)
            with pytest.raises(InvalidAudio):
                await tts.voices.enroll(b"nonsense" * 100, name="Ann", transcript=TRANSCRIPT, consent=CONSENT)
            return await tts.voices.list()

    assert run(go()) == []


def test_a_cloned_voice_speaks_for_its_account_only_and_its_reference_is_prefilled_once():
    async def go():
        async with service(**{"sampling.temperature": 0}) as tts:
            v = await tts.voices.enroll(clip(3.5), name="Ann", transcript=TRANSCRIPT, consent=CONSENT, account="alice")
            ref_len = len(tts.voices.reference(v)[1])
            before = await stats(tts)
            first = await tts.synthesize("Hello there.", voice=v.id, account="alice")
            mid = await stats(tts)
            resolved = await tts.voices.resolve(v.id, "alice")
            second = await tts.synthesize("Hello there.", voice=resolved, account="alice")
            after = await stats(tts)
            with pytest.raises(UnknownVoice):
                tts.stream("Hello", voice=v.id, account="bob")
            with pytest.raises(UnknownVoice):
                tts.stream("Hello", voice=resolved, account="bob")  # a Voice object does not get around it
            with pytest.raises(UnknownVoice):
                await tts.voices.resolve(v.id, "bob")
            await tts.voices.delete(v.id, "alice")
            with pytest.raises(UnknownVoice):
                tts.stream("Hello", voice=v.id, account="alice")
            gone = await tts.on_engine_thread(lambda: len(tts.scheduler.engine.prefixes))
            return ref_len, before, mid, after, first, second, gone

    ref_len, before, mid, after, first, second, gone = run(go())
    prompt = mid["prompt_tokens"] - before["prompt_tokens"]
    assert mid["prefilled_tokens"] - before["prefilled_tokens"] == prompt  # computed in full the first time
    assert after["prefilled_tokens"] - mid["prefilled_tokens"] == prompt - ref_len  # then only the text
    assert after["prefix_cache_hits"] == 1 and gone == 0  # deleting the voice dropped its kept prefix
    assert len(first.pcm) == len(second.pcm) == 6 * 2048  # 42 tokens
    assert same_speech(first.pcm.tobytes(), second.pcm.tobytes())  # greedy: the same tokens (the codec's
    # first chunk varies by tens of units with timing; tests/engine/torch/test_prefix_cache.py compares tokens and logits)


def test_enrollments_and_voice_lookups_do_not_block_the_event_loop():
    """While a clip is decoded, normalised and encoded, the loop keeps ticking (the work is in a worker
    thread, whatever the clip's length)."""
    async def go():
        async with service() as tts:
            ticks, done = 0, asyncio.Event()

            async def tick():
                nonlocal ticks
                while not done.is_set():
                    ticks += 1
                    await asyncio.sleep(0)

            ticker = asyncio.create_task(tick())
            await tts.voices.enroll(clip(6.0), name="Long", transcript=TRANSCRIPT, consent=CONSENT)
            done.set()
            await ticker
            return ticks

    assert run(go()) > 50


def test_a_reference_too_long_for_the_slots_is_refused_at_enrollment():
    async def go():
        async with small_service() as tts:  # kv_cache.max_seq_len 512: room for a ~3 s reference
            with pytest.raises(InvalidAudio, match="reference; this server has room for 310"):
                await tts.voices.enroll(clip(8.0), name="Long", transcript=TRANSCRIPT, consent=CONSENT)
            return await tts.voices.list()

    assert run(go()) == []


def test_a_deleted_voice_held_as_an_object_is_refused_and_its_prefix_not_kept_again():
    async def go():
        async with service() as tts:
            v = await tts.voices.enroll(clip(3.5), name="Ann", transcript=TRANSCRIPT, consent=CONSENT)
            running = tts.stream("Still speaking while deleted.", voice=v)
            await anext(running)  # admitted and prefilled: it finishes
            await tts.voices.delete(v.id)
            rest = [c async for c in running]
            with pytest.raises(UnknownVoice, match="no voice"):
                tts.stream("Hello", voice=v)
            kept = await tts.on_engine_thread(lambda: len(tts.scheduler.engine.prefixes))
            return rest, kept

    rest, kept = run(go())
    assert len(rest) > 0 and kept == 0


def test_a_voice_deleted_by_another_replica_leaves_this_ones_kept_prefixes_at_the_sweep():
    async def go():
        async with service() as tts:
            v = await tts.voices.enroll(clip(3.5), name="Ann", transcript=TRANSCRIPT, consent=CONSENT)
            await tts.synthesize("Kept.", voice=v.id)
            kept = await tts.on_engine_thread(lambda: tts.scheduler.engine.kept_prefixes())
            tts.voices.registry.delete(v.id, v.owner)  # the shared database's row, as another replica deletes it
            await tts._sweep_once()
            with pytest.raises(UnknownVoice):
                tts.stream("Hello", voice=v)  # the object held here is refused too
            return kept, await tts.on_engine_thread(lambda: tts.scheduler.engine.kept_prefixes())

    kept, after = run(go())
    assert len(kept) == 1 and after == []
