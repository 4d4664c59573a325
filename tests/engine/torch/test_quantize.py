"""model.quantize int8: the decoder layers' linears with int8 weights (lyre.engine.torch.quantize),
held to float32: teacher-forced (each position sees float32's own tokens, so one different pick
does not carry into the rest), the next-token distributions stay within a small KL divergence and
pick the same most likely token; it runs only where it can (a CPU, float32), and a service serves
with it."""

from __future__ import annotations

import pytest
import torch

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.torch.quantize import quantize
from lyre.model import checkpoint, orpheus
from lyre.model.sample_texts import TEXT_SETS
from tests.support.engines import drive, make_engine, tokens_of
from tests.support.services import run, service

TEMPERATURE = 0.6  # Orpheus's sampling temperature: the distributions compared are those sampled from


def next_token_logits(model_dir, prompts: list[list[int]], quantization: str, constrain: bool = True) -> list[torch.Tensor]:
    engine = make_engine(model_dir, quantize=quantization, max_seq_len=512)
    one = SamplingParams(temperature=0.0, max_tokens=1, stop_ids=(), constrain_audio=constrain)
    out = drive(engine, {0: [GenerationRequest(f"p{i}", p, one, record_logits=True) for i, p in enumerate(prompts)]})
    return [out[f"p{i}"][0].logits[0] for i in range(len(prompts))]


@pytest.mark.parametrize("constrain", [True, False], ids=["a-frame-slot", "the-whole-vocabulary"])
def test_int8_weights_stay_close_to_float32(demo_dir, constrain):
    llama = demo_dir / "llama"
    tokenizer = checkpoint.load_tokenizer(llama)
    prompts = [orpheus.build_prompt_ids(tokenizer, t, "tara") for t in TEXT_SETS["conversational"][:8]]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, stop_ids=())
    out = drive(make_engine(llama, max_seq_len=512), {0: [GenerationRequest(f"r{i}", p, greedy)
                                                           for i, p in enumerate(prompts)]})
    forced = [p + tokens_of(out[f"r{i}"])[:k] for i, p in enumerate(prompts) for k in range(0, 24, 3)]  # 64 positions
    exact, int8 = next_token_logits(llama, forced, "none", constrain), next_token_logits(llama, forced, "int8", constrain)
    assert exact[0].shape[-1] == (4097 if constrain else orpheus.VOCAB_SIZE)
    kl, same = [], 0
    for a, b in zip(exact, int8, strict=True):
        p, q = torch.log_softmax(a / TEMPERATURE, -1), torch.log_softmax(b / TEMPERATURE, -1)
        kl.append(float((p.exp() * (p - q)).sum()))
        same += int(a.argmax() == b.argmax())
        assert float((a - b).abs().max() / (a.max() - a.min())) < 0.1  # no logit moves by a tenth of the spread
    # measured on the demo: KL 0.0002 mean, 0.0003 at most; the same top token at all 64 positions
    assert sum(kl) / len(kl) < 0.002 and max(kl) < 0.01
    assert same >= 0.9 * len(exact)
    assert any(not torch.equal(a, b) for a, b in zip(exact, int8, strict=True))  # (it did quantize)


@pytest.mark.parametrize("device, dtype", [("cuda", torch.float32), ("cpu", torch.bfloat16)])
def test_int8_is_refused_where_it_cannot_run(device, dtype):
    with pytest.raises(ValueError, match="runs on a CPU in float32"):
        quantize(torch.nn.Module(), "int8", torch.device(device), dtype)


def test_a_service_with_int8_weights_speaks():
    async def go():
        async with service(**{"model.quantize": "int8"}) as tts:
            audio = await tts.synthesize("Hello from int8 weights.", voice="tara", seed=1)
            return audio, tts.scheduler.engine.model.layers[0].mlp.down_proj

    audio, projection = run(go())
    assert len(audio.pcm) == 6 * orpheus.SAMPLES_PER_FRAME and audio.metrics.tokens == 42
    assert "DynamicQuantizedLinear" in repr(projection) and "qint8" in repr(projection)  # int8 linears
