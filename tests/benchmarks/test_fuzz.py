"""The soak's fuzzer can fail: an answer other than the one a corpus input must get is a violation,
on every surface (REST, WebSocket, gRPC, gRPC streams). The full corpus against a real server runs
in the small soak (``test_soak.py``)."""

from __future__ import annotations

import asyncio

import grpc

from lyre.benchmarks import fuzz
from lyre.v1 import tts_pb2


def test_a_corpus_input_answered_otherwise_than_expected_is_a_violation(server):
    fine = {"input": "Hi.", "max_tokens": 14}

    async def go():
        return (await fuzz.rest(server.http, [(fuzz.SPEECH, fine, {}, {400})]),
                await fuzz.ws(server.http, [([{"context_id": "c", "text": "Hi.", "max_tokens": 14}], {"control_token"})]),
                await fuzz.grpc_calls(server.grpc, [("message", tts_pb2.SynthesizeRequest(text="<|eot_id|>"),
                                                     {grpc.StatusCode.NOT_FOUND})]),
                await fuzz.grpc_streams(server.grpc, [("StreamingSynthesize", [
                    tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig(voice="tara")),
                    tts_pb2.StreamingSynthesizeRequest(text="Hi.")], {grpc.StatusCode.INVALID_ARGUMENT})]))

    rest, ws, calls, streams = asyncio.run(go())
    assert len(rest) == 1 and "REST 200 (expected [400])" in rest[0]
    assert len(ws) == 1 and "expected one of ['control_token']" in ws[0]
    assert len(calls) == 1 and "gRPC INVALID_ARGUMENT (expected ['NOT_FOUND'])" in calls[0]
    assert len(streams) == 1 and "StreamingSynthesize OK (expected ['INVALID_ARGUMENT'])" in streams[0]
