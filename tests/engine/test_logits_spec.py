"""One specification of what happens to a step's logits before the draw, held to both engines: the
PyTorch engine's samplers (the host's, and the audio rows' on the device) and the TensorRT-LLM
backend's batched logits post-processor (called as TensorRT-LLM 1.2.1's executor calls it; its own repetition penalty is never set, see
``test_the_executor_penalty_is_never_set``).

The specification (:func:`specified`):
1. the repetition penalty covers the distinct tokens among the last ``repetition_window``
   GENERATED tokens (all generated tokens when the window is 0), never the prompt: a cloned
   voice's reference codes are in the prompt and must not be penalised; a positive logit is
   divided by the penalty, a negative one multiplied;
2. with ``constrain_audio``, from start-of-speech on (the prompt's last token, or a generated one)
   only the 4096 codes of the next audio token's frame slot keep their logits, plus end-of-speech
   at a frame boundary once ``min_tokens`` tokens are generated; everything else is -inf;
3. without the constraint, every stop id is -inf until ``min_tokens`` tokens are generated.
"""

from __future__ import annotations

import random

import pytest
import torch

import lyre.engine.torch.sampler as torch_sampler
import lyre.engine.torch.slot_sampling as slot_sampling
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.torch.constrained import BAND
from lyre.engine.torch.sequence import Sequence
from lyre.engine.trtllm.logits import LogitsPostProcessor
from lyre.model import orpheus
from tests.support import fake_trtllm as tle
from tests.support.trtllm import make, run, tokens

V = orpheus.VOCAB_SIZE
SOS, EOS = orpheus.START_OF_SPEECH, orpheus.END_OF_SPEECH


def code(k: int, value: int) -> int:
    """The id of code ``value`` in frame slot ``k % 7``."""
    return orpheus.AUDIO_TOKEN_OFFSET + (k % 7) * BAND + value


def specified(row: torch.Tensor, prompt: list[int], generated: list[int], p: SamplingParams) -> torch.Tensor:
    """The specification, written plainly over one (vocab,) row."""
    out = row.clone()
    if p.repetition_penalty != 1.0:
        recent = generated[-p.repetition_window:] if p.repetition_window else generated
        for t in set(recent):
            out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    history = prompt + generated
    start = len(prompt) if prompt[-1] == SOS else next(
        (len(prompt) + i + 1 for i, t in enumerate(generated) if t == SOS), None)
    if p.constrain_audio and start is not None:
        k = len(history) - start  # the next audio token's index
        keep = torch.full_like(out, float("-inf"))
        lo = code(k, 0)
        keep[lo:lo + BAND] = out[lo:lo + BAND]
        if k % 7 == 0 and len(generated) >= p.min_tokens:
            keep[EOS] = out[EOS]
        out = keep
    elif len(generated) < p.min_tokens:
        out[list(p.stop_ids)] = float("-inf")
    return out


# --------------------------------------------------------------------------------------------
# the cases: cloned-voice prompts (reference codes in the prompt), repeats inside and outside the
# window, every frame slot, min_tokens either side, start-of-speech in the prompt or generated


def cases(n: int = 40, seed: int = 5) -> list[tuple[list[int], list[int], SamplingParams]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        reference = [code(j, rng.randrange(12)) for j in range(rng.randrange(0, 30))]  # a cloned voice's codes
        text = [orpheus.START_OF_HUMAN, 400 + i, 25]
        in_prompt = i % 5 != 4  # sometimes the model has to say start-of-speech itself
        prompt = reference + text + (list(orpheus.PROMPT_SUFFIX) if in_prompt else [orpheus.END_OF_HUMAN, orpheus.START_OF_AI])
        lead = [] if in_prompt else [rng.randrange(300, 900), SOS]
        audio = [code(j, rng.randrange(12)) for j in range(rng.randrange(0, 90))]  # few values: many repeats
        p = SamplingParams(repetition_penalty=rng.choice([1.0, 1.1, 1.3]), repetition_window=rng.choice([0, 8, 64]),
                           min_tokens=rng.choice([0, 14, 50]), constrain_audio=i % 7 != 6)
        out.append((prompt, lead + audio, p))
    return out


def logits_rows(n: int, seed: int = 9) -> torch.Tensor:
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 3  # (n, V), either sign


# --------------------------------------------------------------------------------------------
# the TensorRT-LLM backend's post-processor


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_tensorrt_llm_post_processor_meets_the_specification(dtype):
    """In the executor's logits dtype (float32 by default; 16-bit when the engine gathers them so)."""
    all_cases = cases()
    rows = logits_rows(len(all_cases)).to(dtype)
    processor = LogitsPostProcessor()
    views, histories, ids = [], [], []
    for i, (prompt, generated, p) in enumerate(all_cases):
        if LogitsPostProcessor.wanted(p):
            processor.register(100 + i, prompt, p)
        views.append(rows[i].clone().view(1, 1, V))  # (1, beam, vocab) as the executor passes them
        histories.append([prompt + generated])
        ids.append(100 + i)
    processor(list(range(len(ids))), views, histories, 0, ids)  # one batched call, as the executor makes it
    assert not processor.failed
    for i, (prompt, generated, p) in enumerate(all_cases):
        assert torch.equal(views[i][0, 0], specified(rows[i], prompt, generated, p)), f"case {i}: {p}"


# --------------------------------------------------------------------------------------------
# the PyTorch engine's sampler


class TableModel:
    """Stands in for the Llama's lm_head only: hidden row ``i`` holds the index of its logits row in a
    table, so the sampler's own column selection (the frame slot's band, end-of-speech) is what runs."""

    def __init__(self, table: torch.Tensor):
        self.table = table  # (n, V)

    def logits(self, hidden, band_start=None, band_size=0):
        rows = self.table[hidden[:, 0].long()]
        return rows if band_start is None else rows[:, band_start:band_start + band_size]

    def logits_of(self, hidden, token_id):
        return self.table[hidden[:, 0].long(), token_id]


def sequence(i: int, prompt: list[int], generated: list[int], p: SamplingParams) -> Sequence:
    """The engine's state of a request after ``generated`` (as TorchEngine.add and _postprocess keep it)."""
    s = Sequence(GenerationRequest(f"r{i}", prompt, p), order=i, generator=torch.Generator().manual_seed(i))
    s.audio_k = 0 if prompt[-1] == SOS else None  # (TorchEngine.add)
    for t in generated:
        s.generated(t)
    return s


def full_row(logits: torch.Tensor, first_id: int, constrained: bool) -> torch.Tensor:
    """A sampler row (4097 constrained columns, or the whole vocabulary) as a (vocab,) row."""
    if not constrained:
        return logits
    out = torch.full((V,), float("-inf"))
    out[first_id:first_id + BAND] = logits[:BAND]
    out[EOS] = logits[BAND]
    return out


def test_the_torch_engine_sampler_meets_the_specification(monkeypatch):
    all_cases = cases()
    rows = logits_rows(len(all_cases))
    seqs = [sequence(i, *case) for i, case in enumerate(all_cases)]
    drawn: list[tuple[list[Sequence], torch.Tensor]] = []
    draw = torch_sampler.draw_columns

    def capture(logits, params):  # what reaches the draw
        drawn.append(logits.clone())
        return draw(logits, params)

    monkeypatch.setattr(torch_sampler, "draw_columns", capture)
    sampler = torch_sampler.StepSampler(TableModel(rows), torch.device("cpu"))
    sampler.sample(seqs, torch.arange(len(seqs), dtype=torch.float32)[:, None])  # (n, 1): each row's table index
    constrained = [i for i, s in enumerate(seqs) if s.constrained]
    free = [i for i, s in enumerate(seqs) if not s.constrained]
    assert len(drawn) == (1 if constrained else 0) + (1 if free else 0)
    got = {}
    for i, row in zip(constrained, drawn[0], strict=True):
        got[i] = full_row(row, code(seqs[i].audio_k, 0), True)
    for i, row in zip(free, drawn[-1], strict=True):
        got[i] = row
    for i, (prompt, generated, p) in enumerate(all_cases):
        assert torch.equal(got[i], specified(rows[i], prompt, generated, p)), f"case {i}: {p}"


def test_the_on_device_sampler_meets_the_specification(monkeypatch):
    """The audio rows' sampler on the device (its history kept as window counts, written by the
    tokens each row generated) gives the draw what the specification says, for every case it takes:
    constrained from the first token (the prompt ends with start-of-speech)."""
    all_cases = [case for case in cases() if case[0][-1] == SOS and case[2].constrain_audio]
    rows = logits_rows(len(all_cases))
    drawn: list[torch.Tensor] = []
    draw = slot_sampling.sample_rows

    def capture(logits, *args):
        drawn.append(logits.clone())
        return draw(logits, *args)

    monkeypatch.setattr(slot_sampling, "sample_rows", capture)
    n = len(all_cases)
    state = slot_sampling.SlotSampling(n, 256, torch.device("cpu"))
    for i, (_, generated, p) in enumerate(all_cases):
        state.admit(i, p)
        for j, t in enumerate(generated):  # what sampling each token recorded
            state.record(torch.tensor([i]), torch.tensor([True]), torch.tensor([j]),
                          torch.tensor([t - orpheus.AUDIO_TOKEN_OFFSET]))
    generated = torch.tensor([len(g) for _, g, _ in all_cases])
    state.sample(TableModel(rows), torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n),
                 torch.ones(n, dtype=torch.bool), generated % 7, generated, torch.arange(n) * 1000)
    assert len(drawn) == 1 and n > 15
    for i, (prompt, gen, p) in enumerate(all_cases):
        got = full_row(drawn[0][i], code(len(gen), 0), True)
        assert torch.equal(got, specified(rows[i], prompt, gen, p)), f"case {i}: {p}"


# --------------------------------------------------------------------------------------------
# the executor's own penalty


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_the_executor_penalty_is_never_set(tmp_path, penalty):
    """TensorRT-LLM's penalty has no window and covers the prompt (a cloned voice's reference codes):
    the executor is never given one, and a penalised request goes through Lyre's post-processor.
    The fake executor penalises as the real one does, so what comes out is the specification's."""
    engine = make(tmp_path, max_batch_size=2, max_seq_len=256, max_input_len=128)
    try:
        reference = [code(j, j % 3) for j in range(21)]
        prompt = reference + [orpheus.START_OF_HUMAN, 400, 25, *orpheus.PROMPT_SUFFIX]
        engine.add(GenerationRequest("c", prompt, SamplingParams(max_tokens=14, min_tokens=14, temperature=0.0,
                                                                 repetition_penalty=penalty, seed=3)))
        sent = engine.executor.enqueued[-1]
        assert sent.sampling_config.repetition_penalty is None
        assert sent.logits_post_processor_name == tle.Request.BATCHED_POST_PROCESSOR_NAME
        got = tokens(run(engine)["c"])
        assert len(got) == 14 and engine.post_processor.requests == {}
        # greedy: each token is the specification's argmax over the fake model's logits for that step
        for n, t in enumerate(got):
            row = tle.fake_logits(3, len(prompt) + n)
            want = int(specified(row, prompt, got[:n], SamplingParams(repetition_penalty=penalty)).argmax())
            assert t == want, f"token {n}"
    finally:
        engine.close()
