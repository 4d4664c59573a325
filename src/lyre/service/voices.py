"""``TTSService.voices``: cloned voices through the library API (the front ends call the same).

    voice = await tts.voices.enroll(open("ann.wav", "rb").read(), name="Ann", transcript="...",
                                    consent={"granted": True, "speaker": "Ann", "source": "self_recorded"})
    async for chunk in tts.stream("Hello", voice=voice.id): ...

Enrollment decodes and normalises the clip (:mod:`lyre.audio.clip`), encodes it as the model
family needs (:mod:`lyre.service.cloning`: SNAC reference tokens for Orpheus; an x-vector, and
with a transcript the 12 Hz codes, for Qwen3-TTS Base), and stores it with its consent record
(:mod:`lyre.storage.registry`). Database work runs in worker threads, decoding and encoding
in the bounded pool of :mod:`lyre.service.workers`; nothing here blocks the event loop or the engine
thread. Enrollments are bounded per account (``accounts.max_enrollments``, counted by the front
ends from the start of the upload) and in all (``voices.max_in_flight``, from the end of it). Deleting a voice drops its kept prefix in the
engine (through ``on_delete``) at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.engine import Engine

from lyre.audio.clip import prepare_clip
from lyre.config import LyreConfig
from lyre.errors import (
    ConsentRequired,
    InvalidAudio,
    InvalidRequest,
    NotPermitted,
    ServiceUnavailable,
    UnknownVoice,
    shorten,
)
from lyre.service.cloning import OrpheusCloning, QwenCloning
from lyre.service.options import MAX_NAME_CHARS, Consent, parse
from lyre.service.workers import AudioWorkers
from lyre.storage.registry import ID_PATTERN, Voice, VoiceRegistry, check_name
from lyre.trust.accounts import DEFAULT_ACCOUNT
from lyre.trust.tokens import SCOPE

log = logging.getLogger("lyre.voices")

class Voices:
    def __init__(self, config: LyreConfig):
        self.config = config
        self.registry: VoiceRegistry | None = None
        self.on_delete: list[Callable[[str], None]] = []  # called with the voice id after a deletion
        self.cloning: OrpheusCloning | QwenCloning | None = None  # None: this model clones no voice
        self.codec_id = self.model_id = ""
        self._references: OrderedDict[str, Any] = OrderedDict()  # voice key -> its prompts' reference part
        self.max_reference_tokens = 0  # set by attach()
        self.deleted: set[str] = set()  # voices deleted while this process runs: a Voice still held is refused
        self.workers = AudioWorkers(config.voices.workers, config.voices.max_in_flight)  # decode/encode uploads

    def open(self, database: Engine) -> None:
        """At service start: the registry in ``database`` (opened and migrated by the service)."""
        self.registry = VoiceRegistry(database, self.config.voices.max_per_account)

    def attach(self, cloning: OrpheusCloning | QwenCloning | None, model_id: str, max_reference_tokens: int) -> None:
        """At service start (blocking): what enrollment encodes with and prompts are built with (None:
        this model clones no voice); ``max_reference_tokens``: the most positions a voice's reference
        may take, leaving room for a segment's text and ``sampling.max_tokens`` in a slot (and the
        engine's prompt limit)."""
        self.cloning = cloning
        self.max_reference_tokens = max_reference_tokens
        self.codec_id, self.model_id = (cloning.codec_id if cloning else ""), model_id

    def _registry(self) -> VoiceRegistry:
        if self.registry is None:
            raise ServiceUnavailable("the service is not running (use `async with TTSService...`)")
        return self.registry

    # --- enrollment -----------------------------------------------------------------------------

    async def enroll(self, audio: bytes, *, name: Any, transcript: Any, consent: Mapping[str, Any] | None,
                     account: str = DEFAULT_ACCOUNT, address: str | None = None, consent_id: str | None = None
                     ) -> Voice:
        """A new cloned voice of ``account`` from a reference recording and its exact transcript.
        Raises ConsentRequired, InvalidAudio, UploadTooLarge, InvalidRequest, VoiceExists,
        TooManyVoices; nothing is stored unless it succeeds. ``consent_id``: the account's consent
        recording the voice is created with (:meth:`lyre.service.consents.Consents.enroll`), named
        in its record; UnknownConsent once it is gone."""
        registry = self._registry()
        cloning = self.cloning
        if cloning is None:
            raise InvalidRequest("voice cloning is not available for this model (Qwen3-TTS clones on Base checkpoints "
                                 "only); its built-in voices are listed by GET /v1/voices")
        record = check_consent(consent)
        name = check_name(name)
        transcript = cloning.check_transcript(transcript)
        with self.workers.place():
            clip = await self.workers.run(prepare_clip, audio, self.config.voices, account=account)
            most = self.config.voices.max_transcript_chars_per_second * clip.seconds
            if len(transcript) > most:
                raise InvalidRequest(f"the transcript has {len(transcript)} characters, more than a {clip.seconds:.1f} "
                                     f"s clip can hold (at most {most:.0f}: voices.max_transcript_chars_per_second); "
                                     "give the exact words spoken in the clip")
            encoded = await self.workers.run(cloning.encode, clip.pcm, transcript, account=account)
        reference = cloning.size(transcript, encoded)
        if reference > self.max_reference_tokens:
            raise InvalidAudio(f"the clip and transcript make a {reference}-position reference; this server has room "
                               f"for {self.max_reference_tokens} (kv_cache.max_seq_len less sampling.max_tokens and a "
                               f"segment's text): use a shorter clip, about "
                               f"{self.max_reference_tokens / cloning.positions_per_second * 0.9:.0f} s at most")
        record.update(time=datetime.now(timezone.utc).isoformat(), account=account, address=address,
                      upload_sha256=clip.upload_sha256)
        if consent_id is not None:
            record["consent_id"] = consent_id
        voice = await asyncio.to_thread(
            registry.add, name=name, owner=account, transcript=transcript, audio_flac=clip.flac,
            audio_sha256=clip.flac_sha256, duration_s=clip.seconds, ref_token_ids=encoded.codes,
            codec_id=self.codec_id, model_id=self.model_id, consent=record, consent_id=consent_id,
            speaker_embedding=encoded.speaker_embedding)
        log.info("voice %s enrolled by account %s (%.1f s, %d reference codes%s)", voice.id, account, clip.seconds,
                 len(encoded.codes), ", an x-vector" if encoded.speaker_embedding else "")
        return voice

    # --- lookups --------------------------------------------------------------------------------

    async def list(self, account: str = DEFAULT_ACCOUNT) -> list[Voice]:
        return await asyncio.to_thread(self._registry().list, account)

    async def get(self, voice_id: Any, account: str = DEFAULT_ACCOUNT) -> Voice:
        return await asyncio.to_thread(self._registry().get, voice_id, account)

    async def consent(self, voice_id: Any, account: str = DEFAULT_ACCOUNT) -> dict[str, Any]:
        return (await self.get(voice_id, account)).consent

    async def delete(self, voice_id: Any, account: str = DEFAULT_ACCOUNT) -> None:
        """Remove the voice, its audio and every cached state of it at once (a synthesis already
        running finishes; new ones get UnknownVoice)."""
        await asyncio.to_thread(self._registry().delete, voice_id, account)
        self.forget(voice_id)
        log.info("voice %s deleted by account %s", voice_id, account)

    def kept(self) -> list[str]:
        """The keys of the references kept here ("<voice id>:...")."""
        return list(self._references)

    def forget(self, voice_id: str) -> None:
        """Drop what is cached of ``voice_id`` here and in the engine; it cannot come back."""
        self.deleted.add(voice_id)
        for key in [k for k in self._references if k.startswith(voice_id + ":")]:
            del self._references[key]
        for callback in self.on_delete:
            callback(voice_id)

    async def resolve(self, name: Any, account: str = DEFAULT_ACCOUNT) -> str | Voice:
        """What a request's ``voice`` means: a built-in voice's name (aliases resolved) or the
        account's cloned voice. Raises UnknownVoice; NotPermitted for a voice outside the scope of
        the client token the request authenticated with."""
        builtin = self._builtin(name)
        return _in_scope(builtin if builtin is not None else await self.get(name, account))

    def resolve_now(self, name: Any, account: str = DEFAULT_ACCOUNT) -> str | Voice:
        """:meth:`resolve` without awaiting (reads the database on this thread: fine in scripts;
        front ends await :meth:`resolve`)."""
        builtin = self._builtin(name)
        return _in_scope(builtin if builtin is not None else self._registry().get(name, account))

    def _builtin(self, name: Any) -> str | None:
        model = self.config.model
        if name is None:
            if not model.default_voice:
                raise InvalidRequest("'voice' is required: this model speaks cloned voices only (GET /v1/voices lists "
                                     "the account's)")
            return model.default_voice
        if not isinstance(name, str):
            raise InvalidRequest(f"'voice' must be a string, got {shorten(name)}")
        if len(name) > MAX_NAME_CHARS:
            raise InvalidRequest(f"'voice' is longer than {MAX_NAME_CHARS} characters")
        resolved = model.resolve_voice(name)
        if resolved is None and not ID_PATTERN.fullmatch(name):
            raise UnknownVoice(f"unknown voice {shorten(name)}; available voices: {', '.join(model.voices)} (or an "
                               f"alias: {', '.join(model.voice_aliases)}), or a cloned voice's id (GET /v1/voices)")
        return resolved

    # --- prompts --------------------------------------------------------------------------------

    def reference(self, voice: Voice) -> tuple[str, Any]:
        """(key, the voice's reference as its family's prompts read it: Orpheus's reference-turn ids,
        a Qwen3-TTS clone): the part of its prompts shared by every request, which the engine computes
        once and keeps under the key."""
        if voice.id in self.deleted:
            raise UnknownVoice(f"no voice {voice.id} (it was deleted)")
        if self.cloning is None or voice.codec_id != self.codec_id:
            raise InvalidRequest(f"voice {voice.id} was enrolled with other codec weights ({voice.codec_id}; this server "
                                 f"runs {self.codec_id or 'a model that clones no voice'}): its reference means nothing "
                                 "here; enroll it again")
        key = f"{voice.id}:{voice.audio_sha256[:16]}"
        reference = self._references.get(key)
        if reference is None:
            reference = self.cloning.reference(key, voice)
            self._references[key] = reference
            while len(self._references) > 256:
                self._references.popitem(last=False)
        else:
            self._references.move_to_end(key)
        return key, reference


def check_consent(consent: Mapping[str, Any] | None) -> dict[str, Any]:
    """The consent record of an enrollment as stored; ConsentRequired (422) when absent or not granted."""
    if consent is None:
        raise ConsentRequired("enrollment needs a consent record: {\"granted\": true, \"speaker\": who is speaking, "
                              "\"source\": \"self_recorded\" or \"recorded_with_permission\", \"statement\": optional}")
    if not isinstance(consent, Mapping):
        raise ConsentRequired("'consent' must be a JSON object: {\"granted\": true, \"speaker\", \"source\", "
                              "\"statement\"}")
    try:
        parsed = parse(Consent, consent)
    except InvalidRequest as e:
        raise ConsentRequired(f"consent: {e}") from None
    if parsed.granted is not True:
        raise ConsentRequired("consent.granted must be true: a voice is cloned only with the speaker's consent")
    return parsed.model_dump()


def _in_scope(voice: str | Voice) -> str | Voice:
    scope = SCOPE.get()
    if scope is not None and scope.voices is not None:
        key = voice.id if isinstance(voice, Voice) else voice
        if key not in scope.voices:
            raise NotPermitted(f"this token may speak only {', '.join(scope.voices)}, not {key}")
    return voice
