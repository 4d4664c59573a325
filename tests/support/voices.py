"""A consent record, a transcript and an enrollment over REST, as the voice tests use them."""

from __future__ import annotations

import json

import requests

from tests.support.audio_files import audio_file, speechlike

CONSENT = {"granted": True, "speaker": "Ann Example", "source": "recorded_with_permission",
           "statement": "Signed release form, 2026-11-01."}


TRANSCRIPT = "The quick brown fox jumps over the lazy dog."


def enroll(srv, name: str, headers: dict | None = None) -> requests.Response:
    return requests.post(srv.http + "/v1/voices", timeout=60, headers=headers, data={
        "transcript": TRANSCRIPT, "name": name, "consent": json.dumps(CONSENT)},
        files={"audio": ("a.wav", audio_file(speechlike(3.5, 16000), 16000, "wav"), "audio/wav")})
