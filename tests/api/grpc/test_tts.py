"""gRPC with generated stubs: the three synthesis calls, voices, stats, health, reflection, errors."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from lyre.v1 import tts_pb2, tts_pb2_grpc
from tests.support.servers import HOLD_SETTINGS, MAX_TOKENS, SECONDS, HeldCall, same_speech, serve_in_process
from tests.support.waiting import until


def call(server, fn):
    async def go():
        async with grpc.aio.insecure_channel(server.grpc) as channel:
            return await fn(tts_pb2_grpc.TextToSpeechStub(channel), channel)

    return asyncio.run(go())


def test_unary_synthesize(server):
    resp = call(server, lambda stub, _: stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hello", voice="tara")))
    assert len(resp.audio) == 4 * 2048 * 2 and resp.audio_config.sample_rate_hz == 24000
    assert resp.metrics.tokens == MAX_TOKENS and resp.metrics.ttfb_ms > 0
    assert abs(resp.metrics.audio_seconds - SECONDS) < 1e-3


def test_server_streaming_chunks_carry_sequence_offsets_and_final_metrics(server):
    async def go(stub, _):
        req = tts_pb2.SynthesizeRequest(text="Hello", audio=tts_pb2.AudioConfig(encoding=tts_pb2.MULAW),
                                        sampling=tts_pb2.SamplingOptions(seed=4, temperature=0.7))
        return [c async for c in stub.SynthesizeStream(req)]

    chunks = call(server, go)
    assert [c.sequence for c in chunks] == list(range(len(chunks)))
    offsets = [c.offset_samples for c in chunks]
    assert offsets == [sum(len(c.audio) for c in chunks[:i]) for i in range(len(chunks))]  # 1 byte per mu-law sample
    assert chunks[-1].final and not any(c.final for c in chunks[:-1])
    assert chunks[-1].metrics.tokens == MAX_TOKENS and all(c.sample_rate_hz == 8000 for c in chunks)
    assert abs(sum(len(c.audio) for c in chunks) - SECONDS * 8000) <= 2


def test_bidirectional_incremental_text(server):
    async def go(stub, _):
        async def requests():
            yield tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig(voice="zoe"))
            yield tts_pb2.StreamingSynthesizeRequest(text="Well, ")
            yield tts_pb2.StreamingSynthesizeRequest(text="here is the answer")
            yield tts_pb2.StreamingSynthesizeRequest(flush=True)
            yield tts_pb2.StreamingSynthesizeRequest(text="And one more thing")

        return [c async for c in stub.StreamingSynthesize(requests())]

    chunks = call(server, go)
    assert chunks[-1].final and chunks[-1].metrics.tokens == 3 * MAX_TOKENS
    assert sum(len(c.audio) for c in chunks) == 3 * 4 * 2048 * 2


def test_voices_stats_health_and_reflection(server):
    async def go(stub, channel):
        voices = await stub.ListVoices(tts_pb2.ListVoicesRequest())
        stats = await stub.GetStats(tts_pb2.GetStatsRequest())
        health = health_pb2_grpc.HealthStub(channel)
        overall = await health.Check(health_pb2.HealthCheckRequest(service=""))
        ours = await health.Check(health_pb2.HealthCheckRequest(service="lyre.v1.TextToSpeech"))
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def ask():
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        answers = [a async for a in refl.ServerReflectionInfo(ask())]
        # the same exchange under reflection's v1 name (grpcurl's first choice): wire-identical messages
        v1 = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                   request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                   response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
        v1_answers = [a async for a in v1(ask())]
        return voices, stats, overall, ours, answers + v1_answers

    voices, stats, overall, ours, answers = call(server, go)
    assert [v.name for v in voices.voices][0] == "tara" and voices.default_voice == "tara"
    assert stats.scheduler.max_concurrent == 8 and stats.kv_cache.used_slots + stats.kv_cache.free_slots == 8
    assert stats.backend == "torch" and stats.engine["kv_cache_bytes"] > 0
    assert overall.status == ours.status == health_pb2.HealthCheckResponse.SERVING
    for answer in answers:  # v1alpha, then v1
        names = {s.name for s in answer.list_services_response.service}
        assert {"lyre.v1.TextToSpeech", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection"} <= names
    assert len(answers) == 2


def test_reflection_describes_every_method_as_grpcurl_asks_for_it(server):
    """``grpcurl describe lyre.v1.TextToSpeech.Synthesize`` asks for the file containing the method's
    full name; protobuf's pool alone answers "Symbol not found" for methods."""
    from google.protobuf import descriptor_pb2
    from riva.client.proto import riva_tts_pb2

    methods = [f"{svc.full_name}.{m.name}" for svc in (tts_pb2.DESCRIPTOR.services_by_name["TextToSpeech"],
                                                        riva_tts_pb2.DESCRIPTOR.services_by_name["RivaSpeechSynthesis"])
               for m in svc.methods]

    async def go(stub, channel):
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def ask():
            for name in [*methods, "lyre.v1.TextToSpeech.NoSuchMethod"]:
                yield reflection_pb2.ServerReflectionRequest(file_containing_symbol=name)

        return [a async for a in refl.ServerReflectionInfo(ask())]

    *found, missing = call(server, go)
    assert len(found) == len(methods) == 11  # 8 of lyre.v1, 3 of Riva
    for name, answer in zip(methods, found, strict=True):
        files = [descriptor_pb2.FileDescriptorProto.FromString(b) for b in answer.file_descriptor_response.file_descriptor_proto]
        service, _, method = name.rpartition(".")
        assert any(f"{f.package}.{s.name}" == service and method in {m.name for m in s.method}
                   for f in files for s in f.service), name
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


@pytest.mark.parametrize(
    "request_, code",
    [
        (tts_pb2.SynthesizeRequest(text=""), grpc.StatusCode.INVALID_ARGUMENT),
        (tts_pb2.SynthesizeRequest(text="hi", voice="bob"), grpc.StatusCode.NOT_FOUND),
        (tts_pb2.SynthesizeRequest(text="x" * 300), grpc.StatusCode.INVALID_ARGUMENT),
        (tts_pb2.SynthesizeRequest(text="hi", audio=tts_pb2.AudioConfig(sample_rate_hz=100)),
         grpc.StatusCode.INVALID_ARGUMENT),
        (tts_pb2.SynthesizeRequest(text="hi", sampling=tts_pb2.SamplingOptions(top_p=5)),
         grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_errors_map_to_status_codes(server, request_, code):
    async def go(stub, _):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Synthesize(request_)
        return info.value

    err = call(server, go)
    assert err.code() == code and err.details()


def test_streaming_call_must_start_with_a_config(server):
    async def go(stub, _):
        async def requests():
            yield tts_pb2.StreamingSynthesizeRequest(text="no config")

        with pytest.raises(grpc.aio.AioRpcError) as info:
            _ = [c async for c in stub.StreamingSynthesize(requests())]
        return info.value

    assert call(server, go).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_client_cancel_and_deadline_free_the_slot(server):
    # seeded: this seed runs to all 800 tokens (an unseeded one may stop early and beat the deadline)
    long = tts_pb2.SynthesizeRequest(text="A long one.", sampling=tts_pb2.SamplingOptions(max_tokens=800, seed=1))

    async def go():
        # (no BDP probing: the call's flow-control window stays at 64 kB, so a client that reads no
        # more holds the stream by backpressure: it cannot end before its deadline, however fast)
        async with grpc.aio.insecure_channel(server.grpc, options=[("grpc.http2.bdp_probe", 0)]) as channel:
            stub = tts_pb2_grpc.TextToSpeechStub(channel)
            call_ = stub.SynthesizeStream(long)
            async for _chunk in call_:
                call_.cancel()  # the caller hangs up after the first audio
                break
            late = stub.SynthesizeStream(long, timeout=0.5)
            try:
                await late.read()  # the first audio (or already the deadline), then it reads no more
            except grpc.aio.AioRpcError as e:
                return e.code()
            return await late.code()  # how the call ended

    assert asyncio.run(go()) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert server.eventually_idle()["kv_cache"]["free_slots"] == 8


def test_voice_aliases_work_over_grpc(server):
    """OpenAI's names are aliases on every protocol (case-insensitive), with the aliased voice's audio."""
    speak = lambda voice: call(server, lambda stub, _: stub.Synthesize(  # noqa: E731
        tts_pb2.SynthesizeRequest(text="Hello", voice=voice, sampling=tts_pb2.SamplingOptions(seed=9)))).audio
    assert same_speech(speak("Nova"), speak("mia"))


def test_a_call_hung_up_while_held_by_backpressure_leaves_nothing_in_flight():
    with serve_in_process("server.drain_timeout_s=0", *HOLD_SETTINGS) as srv:  # (the drain counts, then cancels)
        held = HeldCall(srv.grpc)
        until(lambda: srv.stats()["scheduler"]["throttled_sessions"] == 1, what="backpressure to hold the call")
        held.close()  # hung up while the server waits to send
        srv.eventually_idle()  # its session ended, its slot is free
        mark = srv.log_mark()
        assert srv.stop() == 0
        assert "draining 0 in-flight request(s)" in srv.log(since=mark)


def test_a_message_over_its_methods_limit_is_refused_by_name_and_the_server_serves_on(server):
    big = "word " * 60_000  # 300 kB of text: over server.max_body_bytes (262144), under grpcio's own cap

    async def go(stub, _):
        refused = []
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Synthesize(tts_pb2.SynthesizeRequest(text=big))
        refused.append(e.value)

        async def requests():  # a later message of a stream, too
            yield tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.StreamingConfig(voice="tara"))
            yield tts_pb2.StreamingSynthesizeRequest(text=big)

        with pytest.raises(grpc.aio.AioRpcError) as e:
            [c async for c in stub.StreamingSynthesize(requests())]
        refused.append(e.value)
        return refused, await stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hello"))

    refused, after = call(server, go)
    for error in refused:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # not to be retried as it is
        assert "bytes; at most 262144 are taken (server.max_body_bytes)" in error.details()
    assert "SynthesizeRequest message is" in refused[0].details()
    assert len(after.audio) == 4 * 2048 * 2  # the server serves on
    assert server.eventually_idle()["kv_cache"]["free_slots"] == 8


def test_connection_limits_are_grpcios_own_options():
    from lyre.api.grpc.server import grpc_options
    from lyre.config import load_config

    options = dict(grpc_options(load_config(None, {
        "server.grpc_max_streams_per_connection": 5, "server.grpc_max_connection_idle_s": 0,
        "server.grpc_max_connection_age_s": 60, "server.grpc_max_connection_age_grace_s": 2.5,
        "server.max_body_bytes": 100_000, "voices.max_upload_bytes": 2_000_000})))
    assert options["grpc.max_concurrent_streams"] == 5
    assert options["grpc.max_connection_idle_ms"] == 2**31 - 1  # 0: never
    assert options["grpc.max_connection_age_ms"] == 60_000 and options["grpc.max_connection_age_grace_ms"] == 2500
    assert options["grpc.max_receive_message_length"] == 2_000_000 + 64 * 1024  # an enrollment's audio and its fields
    assert options["grpc.keepalive_permit_without_calls"] == 0
