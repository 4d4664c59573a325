"""``lyre.v1.TextToSpeech``'s voice calls: ListVoices (built-in and the caller's cloned voices),
EnrollVoice, GetVoice (with its consent record), DeleteVoice. Mixed into the servicer in
:mod:`lyre.api.grpc.server`, whose ``_serving`` checks each call and yields its account."""

from __future__ import annotations

from typing import Any

from lyre.errors import InvalidRequest
from lyre.storage.registry import Voice
from lyre.v1 import tts_pb2


class VoiceMethods:
    async def ListVoices(self, request, context):
        async with self._serving(context, request) as account:
            cloned = await self.service.voices.list(account)
            return tts_pb2.ListVoicesResponse(
                voices=[_builtin(self.service, v) for v in self.service.builtin_voices] + [_cloned(v) for v in cloned],
                default_voice=self.service.config.model.default_voice)

    async def EnrollVoice(self, request, context):
        async with self._serving(context, request) as account:
            consent = ({f.name: v for f, v in request.consent.ListFields()} if request.HasField("consent") else None)
            with self.service.quotas.hold(account, "enrollments"):
                voice = await self.service.voices.enroll(request.audio, name=request.name,
                                                         transcript=request.transcript, consent=consent,
                                                         account=account, address=self.client_address(context))
            return _cloned(voice)

    async def GetVoice(self, request, context):
        async with self._serving(context, request) as account:
            voice = await self.service.voices.resolve(request.id, account)
            if isinstance(voice, str):
                return _builtin(self.service, voice)
            message = _cloned(voice)
            message.consent.CopyFrom(tts_pb2.Consent(**{k: v for k, v in voice.consent.items()
                                                        if v is not None and k in tts_pb2.Consent.DESCRIPTOR.fields_by_name}))
            return message

    async def DeleteVoice(self, request, context):
        async with self._serving(context, request) as account:
            if self.service.config.model.resolve_voice(request.id) is not None:
                raise InvalidRequest(f"{request.id!r} is a built-in voice: only cloned voices can be deleted")
            await self.service.voices.delete(request.id, account)
            return tts_pb2.DeleteVoiceResponse()


def _builtin(service: Any, name: str) -> Any:
    return tts_pb2.Voice(name=name, id=name, type="builtin", aliases=service.config.model.aliases_of(name))


def _cloned(voice: Voice) -> Any:
    return tts_pb2.Voice(name=voice.name, id=voice.id, type="cloned", created_at=voice.created_at.isoformat(),
                         transcript=voice.transcript, duration_s=voice.duration_s)
