"""NVIDIA Riva's TTS API on Lyre's gRPC port: ``nvidia.riva.tts.RivaSpeechSynthesis``, so a stack
built on ``riva.client.SpeechSynthesisService`` works by changing only its URI.

The messages and service are NVIDIA's own, from the ``nvidia-riva-client`` package (MIT licence;
https://github.com/nvidia-riva/python-clients), which ships the generated ``riva_tts`` modules:

- ``Synthesize``: the whole text's audio in one response (text longer than the profile's
  ``max_text_chars`` is split into sentences, up to ``server.max_input_chars``);
- ``SynthesizeOnline``: a stream of requests (the 2.28 client sends one per text; the first one's
  settings hold for the call: a later request is checked like the first, and one that changes a
  setting it gives is refused), audio streamed back as it is decoded, each response's
  ``meta.text`` the sentence it speaks;
- ``GetRivaSynthesisConfig``: the voices, as Riva lists its models (``voice_name`` and
  ``subvoices``: the full names are ``<voice_name>.<subvoice>``).

Requests: ``encoding`` in Riva's numbering (LINEAR_PCM — raw s16le, no header — FLAC, MULAW,
OGGOPUS, ALAW; unspecified is LINEAR_PCM); ``sample_rate_hz`` resamples (0: the model's 24 kHz;
Opus takes the next rate it supports, 8/12/16/24/48 kHz); ``voice_name``: a Riva name mapped by
``riva.subvoices``, or a Lyre voice or alias (empty: the default voice); ``language_code`` must be
``riva.language_code``'s language (or empty); ``custom_configuration`` may carry Lyre's sampling
options (``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``, ``max_tokens``,
``min_tokens``, ``seed``) and ``instructions`` (a voice description, for a Qwen3-TTS checkpoint that
reads one; Orpheus ignores it, as on every protocol), ``text_normalization`` (auto, on, off) and ``ssml``
(auto, lenient, off: Riva clients send SSML in ``text``) and ``lexicons`` (ids, comma-separated); ``id``
is echoed on every response. ``custom_dictionary`` (phonemes) and
``zero_shot_data`` (cloning per request) are refused with INVALID_ARGUMENT: Orpheus reads text as
written, and a voice is cloned only with its speaker's consent on record (enroll it, then pass its
id as ``voice_name``: cloned voices of the caller's account work like built-in ones).
``enable_word_time_offsets`` is accepted; ``meta.words`` stays
empty (Orpheus does not align words). Failures get the same status codes as ``lyre.v1``.
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from riva.client.proto import riva_audio_pb2, riva_tts_pb2

from lyre.api.access import add_audio
from lyre.api.common import describe_text, whole_audio
from lyre.api.grpc.base import Servicer, Undecodable, log, utterance_audio
from lyre.api.grpc.base import handlers as _handlers
from lyre.audio.formats import AudioEncoder, check_format
from lyre.errors import InvalidRequest, UnknownVoice, shorten
from lyre.model import orpheus
from lyre.service.options import SamplingOptions, parse
from lyre.service.tts import TTSService
from lyre.storage.registry import ID_PATTERN

SERVICE = riva_tts_pb2.DESCRIPTOR.services_by_name["RivaSpeechSynthesis"]
SERVICE_NAME = SERVICE.full_name
Encoding = riva_audio_pb2.AudioEncoding
FORMATS = {Encoding.ENCODING_UNSPECIFIED: "pcm", Encoding.LINEAR_PCM: "pcm", Encoding.FLAC: "flac",
           Encoding.MULAW: "mulaw", Encoding.OGGOPUS: "opus", Encoding.ALAW: "alaw"}
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
_SAMPLING_TYPES = {name: (int if int in typing.get_args(field.annotation) else float)
                   for name, field in SamplingOptions.model_fields.items()}


@dataclass(frozen=True)
class Settings:
    """What a SynthesizeSpeechRequest asks for, checked."""

    format: str
    sample_rate: int
    voice: str | None
    sampling: dict[str, Any]


def settings(request: Any, service: TTSService) -> Settings:
    """The checked settings of ``request``; InvalidRequest (or AudioFormatError) naming the field."""
    cfg = service.config
    fmt = FORMATS.get(request.encoding)
    if fmt is None:
        raise InvalidRequest(f"unknown encoding {request.encoding}; Riva's are "
                             + ", ".join(f"{Encoding.Name(e)} ({e})" for e in FORMATS if e))
    rate = request.sample_rate_hz or orpheus.SAMPLE_RATE
    if fmt == "opus" and rate not in OPUS_RATES:
        rate = next((r for r in OPUS_RATES if r >= rate), rate)  # Opus runs at these only
    check_format(fmt, rate)
    language, spoken = request.language_code.strip(), {}
    if service.family.name != "orpheus" and language:  # a multilingual family: the language it names
        try:
            spoken = {"language": service.family.language_of(language)}
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
    elif language and language.split("-")[0].lower() != cfg.riva.language_code.split("-")[0].lower():
        raise InvalidRequest(f"language_code {language!r} is not served: this model speaks {cfg.riva.language_code}")
    elif language:  # (Orpheus: en-GB reads 03/04 as the 3rd of April)
        spoken = {"language": language}
    if request.custom_dictionary:
        raise InvalidRequest("custom_dictionary is not supported: Orpheus reads text as written (no phoneme "
                             "dictionary); spell words the way they are said")
    if request.HasField("zero_shot_data") and request.zero_shot_data.audio_prompt:
        raise InvalidRequest("zero_shot_data is not accepted: a voice is cloned only with its speaker's consent on "
                             "record; enroll it once (POST /v1/voices or lyre.v1 EnrollVoice) and pass its id as "
                             "voice_name")
    voice = None
    if request.voice_name.strip():
        voice = cfg.riva.resolve_voice(request.voice_name)
        if cfg.model.resolve_voice(voice) is None and not ID_PATTERN.fullmatch(voice):
            raise UnknownVoice(
                f"unknown voice_name {shorten(request.voice_name)}; Riva names: "
                f"{', '.join(f'{cfg.riva.voice_name}.{s}' for s, v in cfg.riva.subvoices.items() if v in cfg.model.voices)}"
                f"; Lyre voices: {', '.join(cfg.model.voices)}; or a cloned voice's id")
    options = dict(request.custom_configuration)
    for name in ("instructions", "text_normalization", "ssml"):  # (Lyre's, which Riva has no field for)
        if name in options:
            spoken[name] = options.pop(name)
    if "lexicons" in options:  # (comma-separated ids)
        spoken["lexicons"] = [i.strip() for i in options.pop("lexicons").split(",") if i.strip()]
    return Settings(fmt, rate, voice, {**_sampling(options), **spoken})


def _sampling(options: dict[str, str]) -> dict[str, Any]:
    """Lyre's sampling options from Riva's string-valued ``custom_configuration``."""
    values: dict[str, Any] = {}
    for key, text in options.items():
        kind = _SAMPLING_TYPES.get(key)
        if kind is None:
            raise InvalidRequest(f"unknown custom_configuration key {key!r}; Lyre reads: {', '.join(_SAMPLING_TYPES)}, "
                                 "instructions, text_normalization, ssml, lexicons")
        try:
            values[key] = kind(text)
        except ValueError:
            raise InvalidRequest(f"custom_configuration {key} = {text!r} is not "
                                 f"{'an integer' if kind is int else 'a number'}") from None
    return parse(SamplingOptions, values).sampling()


def _response(request: Any, audio: bytes, text: str) -> Any:
    add_audio(0.0, len(audio))
    response = riva_tts_pb2.SynthesizeSpeechResponse(audio=audio)
    response.meta.text = response.meta.processed_text = text
    if request.HasField("id"):
        response.id.CopyFrom(request.id)
    return response


class RivaSpeechSynthesis(Servicer):
    async def Synthesize(self, request, context):
        async with self._serving(context, request) as account:
            s = settings(request, self.service)
            voice = await self.service.voices.resolve(s.voice, account)
            stream = self.service.speak(request.text, voice, account=account, protocol="riva", **s.sampling)
            log.debug("Riva Synthesize: %s, %s at %d Hz", describe_text(request.text), s.format, s.sample_rate)
            return _response(request, await whole_audio(stream, AudioEncoder(s.format, s.sample_rate, stream=False)), request.text)

    async def SynthesizeOnline(self, request_iterator, context) -> AsyncIterator[Any]:
        async with self._serving(context) as account:
            first = await anext(request_iterator, None)
            if first is None:
                raise InvalidRequest("no request: send a SynthesizeSpeechRequest")
            if isinstance(first, Undecodable):
                raise first.refusal()
            s = settings(first, self.service)
            voice = await self.service.voices.resolve(s.voice, account)
            utterance = self.service.utterance(voice, account=account, protocol="riva", **s.sampling)
            encoder = AudioEncoder(s.format, s.sample_rate)

            async def same_settings(message: Any) -> None:
                await self._check_later(message, s, voice, account)

            reader = asyncio.get_running_loop().create_task(
                _read_texts(first, request_iterator, utterance, same_settings))
            async for data, last in utterance_audio(utterance, encoder, reader):
                if last and not utterance.pieces:
                    raise InvalidRequest("text is empty: there is nothing to speak")
                if data:
                    yield _response(first, data, utterance.current_piece or utterance.pieces[-1])

    async def _check_later(self, message: Any, first: Settings, voice: Any, account: str) -> None:
        """A later SynthesizeOnline message is checked like the first (its encoding, rate, language,
        voice, for this account, and options); a setting it gives must be the first message's:
        the call's settings are fixed by its first message."""
        later = settings(message, self.service)
        changed = [name for name, given, same in (
            ("encoding", message.encoding, later.format == first.format),
            ("sample_rate_hz", message.sample_rate_hz, later.sample_rate == first.sample_rate),
            ("custom_configuration", message.custom_configuration, later.sampling == first.sampling)) if given and not same]
        if message.voice_name.strip():
            named = await self.service.voices.resolve(later.voice, account)  # UnknownVoice: not this account's
            if _voice_id(named) != _voice_id(voice):
                changed.append("voice_name")
        if changed:
            raise InvalidRequest(f"this SynthesizeOnline call's settings are fixed by its first message; a later one "
                                 f"changes {', '.join(changed)}: start another call for other settings")

    async def GetRivaSynthesisConfig(self, request, context):
        """The built-in voices, as Riva lists them; without a key too (``riva.config_without_key``:
        Riva clients ask at start without their metadata). Cloned voices are never listed here."""
        async with self._serving(context, request, keyless=self.service.config.riva.config_without_key):
            cfg = self.service.config
            served = [(sub, voice) for sub, voice in cfg.riva.subvoices.items() if voice in cfg.model.voices]
            config = riva_tts_pb2.RivaSynthesisConfigResponse.Config(model_name=f"lyre-{cfg.model.hf_id.split('/')[-1]}")
            config.parameters.update({
                "language_code": cfg.riva.language_code,
                "voice_name": cfg.riva.voice_name,
                "subvoices": ",".join(f"{sub}:{i}" for i, (sub, _) in enumerate(served)),
                "lyre_voices": ",".join(cfg.model.voices),  # Lyre's own names, accepted as voice_name too
                "subvoice_voices": ",".join(f"{sub}:{voice}" for sub, voice in served),
                "sample_rate": str(orpheus.SAMPLE_RATE),
                "default_voice": cfg.model.default_voice,
            })
            if request.model_name and request.model_name != config.model_name:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"no model {shorten(request.model_name)}; "
                                                               f"this server has {config.model_name!r}")
            return riva_tts_pb2.RivaSynthesisConfigResponse(model_config=[config])


def _voice_id(voice: Any) -> str | None:
    return voice if voice is None or isinstance(voice, str) else voice.id


async def _read_texts(first: Any, requests: AsyncIterator[Any], utterance: Any,
                      same_settings: Callable[[Any], Awaitable[None]]) -> None:
    """Each request's text into the utterance, spoken as it arrives; the stream's end ends it. A bad
    message (``same_settings`` checks each one after the first) cancels the utterance and raises
    (the call's answer)."""
    try:
        message = first
        while message is not None:
            if message.text.strip():
                utterance.append(message.text)
                utterance.flush()
            message = await anext(requests, None)
            if isinstance(message, Undecodable):
                raise message.refusal()
            if message is not None:
                await same_settings(message)
        utterance.end()
    except BaseException:
        utterance.cancel()
        raise


def handlers(service: TTSService, inflight: Any) -> grpc.GenericRpcHandler:
    return _handlers(RivaSpeechSynthesis(service, inflight), SERVICE, riva_tts_pb2)
