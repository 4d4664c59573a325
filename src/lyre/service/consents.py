"""``TTSService.consents``: consent recordings, OpenAI's voice consents, and voices created with one.

    consent = await tts.consents.record(open("ann-consent.wav", "rb").read(), name="Ann", language="en-US")
    voice = await tts.consents.enroll(open("ann.wav", "rb").read(), consent=consent.id, name="Ann",
                                      transcript="The exact words spoken in the clip.")

OpenAI's flow: the speaker records a consent statement, uploaded first; a voice is then created
from a sample and that recording's id. Here the recording is checked as audio (decoded and
normalised like a reference clip, :mod:`lyre.audio.clip`: 3-30 s, not silent, not clipping) and
kept as evidence with its label, language, time, account, client address and the sha256 of the
upload; a voice created with it is an ordinary enrollment (:meth:`lyre.service.voices.Voices.enroll`)
whose consent record names the recording. Lyre does not listen to the recording: that it says the
consent phrase, and that its speaker is the sample's, is the uploader's responsibility.

Deleting a voice keeps its recording; a recording that voices were created with cannot be deleted
(ConsentInUse) until they are. Each upload, voice and deletion is logged (``lyre.voices``).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from lyre.audio.clip import prepare_clip
from lyre.errors import InvalidRequest, ServiceUnavailable, shorten
from lyre.service.voices import Voices
from lyre.storage.consents import LABEL, ConsentRecording, ConsentRegistry
from lyre.storage.registry import Voice, check_name
from lyre.trust.accounts import DEFAULT_ACCOUNT

log = logging.getLogger("lyre.voices")

LANGUAGE = re.compile(r"[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*")  # a BCP 47 tag's form: en, en-US, zh-Hant-TW
MAX_LANGUAGE_CHARS = 64


def check_language(language: Any) -> str:
    if not isinstance(language, str) or not language.strip():
        raise InvalidRequest("'language' is required: the BCP 47 tag of the consent phrase's language, e.g. en-US")
    language = language.strip()
    if len(language) > MAX_LANGUAGE_CHARS or not LANGUAGE.fullmatch(language):
        raise InvalidRequest(f"'language' must be a BCP 47 language tag such as en or en-US, not {shorten(language)}")
    return language


class Consents:
    def __init__(self, voices: Voices):
        self.voices = voices
        self._store: ConsentRegistry | None = None

    def _registry(self) -> ConsentRegistry:
        """The recordings in the voices' database (opened with the service)."""
        registry = self.voices.registry
        if registry is None:
            raise ServiceUnavailable("the service is not running (use `async with TTSService...`)")
        if self._store is None or self._store.engine is not registry.engine:
            self._store = ConsentRegistry(registry.engine, self.voices.config.voices.max_per_account)
        return self._store

    async def record(self, recording: bytes, *, name: Any, language: Any, account: str = DEFAULT_ACCOUNT,
                     address: str | None = None) -> ConsentRecording:
        """A new consent recording of ``account``. Raises InvalidRequest, InvalidAudio,
        UploadTooLarge, TooManyConsents; nothing is stored unless it succeeds."""
        registry = self._registry()
        name, language = check_name(name, LABEL), check_language(language)
        workers = self.voices.workers
        with workers.place():
            clip = await workers.run(prepare_clip, recording, self.voices.config.voices, account=account)
        consent = await asyncio.to_thread(
            registry.add, owner=account, name=name, language=language, audio_flac=clip.flac,
            audio_sha256=clip.flac_sha256, upload_sha256=clip.upload_sha256, duration_s=clip.seconds, address=address)
        log.info("consent recording %s uploaded by account %s (%.1f s, %s, upload sha256 %s)", consent.id, account,
                 clip.seconds, language, clip.upload_sha256)
        return consent

    async def get(self, consent_id: Any, account: str = DEFAULT_ACCOUNT) -> ConsentRecording:
        return await asyncio.to_thread(self._registry().get, consent_id, account)

    async def list(self, account: str = DEFAULT_ACCOUNT) -> list[ConsentRecording]:
        """Newest first."""
        return await asyncio.to_thread(self._registry().list, account)

    async def rename(self, consent_id: Any, name: Any, account: str = DEFAULT_ACCOUNT) -> ConsentRecording:
        """A new label (the recording and its record stay as they are)."""
        return await asyncio.to_thread(self._registry().rename, consent_id, account, name)

    async def audio(self, consent_id: Any, account: str = DEFAULT_ACCOUNT) -> bytes:
        """The recording as kept: 24 kHz FLAC, loudness-normalised."""
        return await asyncio.to_thread(self._registry().audio, consent_id, account)

    async def delete(self, consent_id: Any, account: str = DEFAULT_ACCOUNT) -> None:
        """Remove the recording and its audio; ConsentInUse while voices created with it exist."""
        await asyncio.to_thread(self._registry().delete, consent_id, account)
        log.info("consent recording %s deleted by account %s", consent_id, account)

    async def enroll(self, audio: bytes, *, consent: Any, name: Any, transcript: Any, account: str = DEFAULT_ACCOUNT,
                     address: str | None = None) -> Voice:
        """A cloned voice of ``account`` from a sample, its exact transcript and the id of the
        account's consent recording (``consent``): :meth:`Voices.enroll` with a consent record that
        names the recording. UnknownConsent (404) for a recording that is not the account's."""
        recording = await self.get(consent, account)
        record = {"granted": True, "speaker": recording.name, "source": "recorded_with_permission",
                  "statement": f"consent recording {recording.id} ({recording.language}, {recording.duration_s:.1f} s, "
                               f"uploaded {recording.created_at.isoformat()}, sha256 {recording.upload_sha256})"}
        return await self.voices.enroll(audio, name=name, transcript=transcript, consent=record, account=account,
                                        address=address, consent_id=recording.id)
