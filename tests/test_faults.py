"""Faults stay with their request: a fault that hits one session — the engine refusing it, its
sampling, its prefill, its decode step, its codec decode, delivery to its consumer — ends that
session alone. Through the real TorchEngine and codec on the demo checkpoint; the fault is
injected by wrapping the real method so it raises only for the poisoned session ("s1")."""

from __future__ import annotations

import asyncio

import pytest

from lyre import orpheus
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.service import SynthesisFailed

from .test_service import engine_state, run, service

FULL = 6 * orpheus.SAMPLES_PER_FRAME  # 42 tokens: every session's whole audio
POISONED = "s1"


def _poisoned_seq(engine):
    return engine._by_id.get(f"{POISONED}#0")


def inject(tts, stage: str, monkeypatch) -> None:
    engine, codec = tts.scheduler.engine, tts.scheduler.audio.codec
    fault = RuntimeError(f"simulated {stage} fault")

    if stage == "add":
        add = engine.add
        monkeypatch.setattr(engine, "add", lambda r: (_ for _ in ()).throw(fault)
                            if r.request_id.startswith(POISONED + "#") else add(r))
    elif stage == "sampling":
        sample_rows = engine._sample_rows

        def poisoned(seqs, *args):
            if any(s.request.request_id.startswith(POISONED + "#") and s.num_generated >= 10 for s in seqs):
                raise fault
            return sample_rows(seqs, *args)

        monkeypatch.setattr(engine, "_sample_rows", poisoned)
    elif stage in ("prefill", "decode"):
        forward = engine.model.forward

        def poisoned(batch, cache):
            seq = _poisoned_seq(engine)
            if seq is not None:
                rows = (batch.slots == seq.slot).sum().item()
                if (stage == "prefill" and rows > 1) or (stage == "decode" and rows == 1 and seq.num_generated >= 14):
                    raise fault
            return forward(batch, cache)

        monkeypatch.setattr(engine.model, "forward", poisoned)
    elif stage == "codec":
        decode_group = codec._decode_group

        def poisoned(group, prefix):
            s = tts.scheduler.active.get(POISONED)
            if s is not None and any(j.stream is s.segments[0].decoder for j in group):
                raise fault
            return decode_group(group, prefix)

        monkeypatch.setattr(codec, "_decode_group", poisoned)


async def _closed_loop_stream(tts):
    """A stream whose caller's event loop has closed (delivering to it raises RuntimeError)."""
    def open_in_another_loop():
        async def make():
            return tts.stream("Delivered to nobody.", seed=2)

        return asyncio.run(make())  # the loop closes here, the session lives on

    return await asyncio.to_thread(open_in_another_loop)


@pytest.mark.parametrize("stage", ["add", "sampling", "prefill", "decode", "codec", "sink"])
def test_a_fault_in_one_session_fails_it_alone(stage, monkeypatch):
    async def read(stream):
        try:
            return "finished", sum([len(c.pcm) async for c in stream])
        except SynthesisFailed as e:
            return str(e), None

    async def go():
        async with service(**{"codec.overlap": "off"}) as tts:
            inject(tts, stage, monkeypatch)
            first = tts.stream("The first caller.", seed=1)  # s0
            if stage == "sink":
                await _closed_loop_stream(tts)  # s1
                streams = [first, tts.stream("The third caller.", seed=3)]
            else:
                streams = [first, tts.stream("The poisoned caller.", seed=2), tts.stream("The third caller.", seed=3)]
            results = await asyncio.gather(*(read(s) for s in streams))
            monkeypatch.undo()
            after = await read(tts.stream("A caller after the fault.", seed=4))
            return results, after, await engine_state(tts), tts._loop.alive

    results, after, state, alive = run(go())
    if stage == "sink":
        assert results == [("finished", FULL), ("finished", FULL)]
    else:
        assert results[0] == results[2] == ("finished", FULL)  # the others: every sample of their audio
        reason, _ = results[1]
        assert f"simulated {stage} fault" in reason, reason
    assert after == ("finished", FULL) and alive
    assert state["gate"] == 0 and state["engine_active"] == 0 and state["active"] == 0
    assert state["codec_states"] == 0 and state["free_slots"] == 8


def test_the_engine_isolates_a_failing_row_and_the_others_get_the_same_tokens(monkeypatch):
    """At the engine: a batched step that raises is run request by request; seeded requests get
    exactly the tokens they get without the fault."""
    async def tokens(poison: bool):
        async with service() as tts:
            def work():
                engine = tts.scheduler.engine
                if poison:
                    sample_rows = engine._sample_rows

                    def poisoned(seqs, *args):
                        if any(s.request.request_id == "bad" and s.num_generated >= 3 for s in seqs):
                            raise RuntimeError("simulated sampling fault")
                        return sample_rows(seqs, *args)

                    monkeypatch.setattr(engine, "_sample_rows", poisoned)
                prompt = orpheus.build_prompt_ids(tts.tokenizer, "Same tokens?", "tara")
                for rid in ("a", "bad", "b"):
                    engine.add(GenerationRequest(rid, prompt, SamplingParams(max_tokens=20, seed=7)))
                out: dict[str, list] = {"a": [], "bad": [], "b": []}
                reasons = {}
                while engine.has_work():
                    for d in engine.step():
                        out[d.request_id] += d.token_ids
                        if d.finished:
                            reasons[d.request_id] = d.finish_reason
                monkeypatch.undo()
                return out, reasons

            return await tts.on_engine_thread(work)

    clean, clean_reasons = run(tokens(False))
    faulty, reasons = run(tokens(True))
    assert reasons["bad"] == "error" and len(faulty["bad"]) == 3
    assert faulty["a"] == clean["a"] and faulty["b"] == clean["b"] and len(clean["a"]) == 20
