"""Qwen3-TTS on the PyTorch engine's static KV slots (issue 31).

:class:`QwenEngine` is a :class:`~lyre.engine.torch.engine.TorchEngine` whose model reads input
rows instead of ids: the slot pool, scheduling (decode order, prefill budget), prefill chunking,
fault isolation and cancellation are the token engine's. What differs:

- admission embeds the request's prompt rows and trailing text rows once, on the device;
- a decode step's input row is the slot's last frame (its 16 codebooks' embeddings summed) plus
  its text track: the next trailing text row, then tts_pad (each slot keeps its own cursor);
- a sampling row makes a whole frame (:class:`~lyre.engine.qwen3.sampler.FrameSampler`:
  codebook 0, then the code predictor batched across every row of the step), delivered as one
  delta of 16 codes; end of speech (``stop``) delivers none; ``max_tokens`` counts frames;
  codebook 0 held in one short cycle for ``repetition_guard`` frames ends it (``repetition``).

Positions count per slot from 0 (the reference's three equal M-RoPE rows are plain RoPE).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lyre.engine.base import GenerationRequest, SamplingParams, TokenDelta
from lyre.engine.qwen3.decode_graph import StaticDecode
from lyre.engine.qwen3.model import Talker, load_qwen3tts
from lyre.engine.qwen3.request import FrameRequest, FrameSequence
from lyre.engine.qwen3.sampler import Frame, FrameSampler
from lyre.engine.torch.engine import TorchEngine, TorchEngineConfig
from lyre.engine.torch.llama import ForwardBatch
from lyre.engine.torch.sampler import Sampled
from lyre.engine.torch.sequence import Sequence
from lyre.engine.torch.transfer import upload
from lyre.model import checkpoint
from lyre.model.qwen3tts import CODE_GROUPS, CODES, Qwen3TTSConfig, TalkerPrompt, read_qwen3tts_config
from lyre.model.qwen3tts.prompt import XVECTOR


@dataclass
class StaticStep:
    """A decode-only step's input for :class:`StaticDecode`: a row per decoding slot, in decode order."""

    rows: torch.Tensor  # (N, H)
    slots: list[int]
    positions: list[int]


class QwenEngine(TorchEngine):
    PROMPT_UNIT = "rows"

    def __init__(self, talker: Talker, config: TorchEngineConfig, static_decode: bool | None = None,
                 graphs: bool | None = None):
        """``static_decode``: decode-only steps over static shapes (:mod:`.decode_graph`; default: on a
        GPU, where they are CUDA graphs; on a CPU the eager static step only serves the tests).
        ``graphs``: capture CUDA graphs (default: on a GPU unless ``engine.cuda_graphs`` is off; without
        them the same code runs eagerly). A capture that fails stops the start (GraphCaptureError)."""
        super().__init__(talker.decoder, config)
        self.talker = talker
        graphs = self.device.type == "cuda" and config.cuda_graphs if graphs is None else graphs
        # (the code predictor's 15-pass loop: one CUDA graph per batch bucket on a GPU, eager elsewhere)
        self.sampler = FrameSampler(talker, config.slots, config.max_seq_len, self.device, graphs=graphs)
        static = graphs if static_decode is None else static_decode
        self.static = StaticDecode(talker.decoder, self.cache, graphs=graphs) if static else None
        with torch.inference_mode():
            self.pad_row = talker.text_rows(upload([talker.cfg.text.tts_pad], self.device))[0]  # (H,)
            if graphs:
                self.sampler.loop.prepare(self.device)
                if self.static is not None:
                    self.static.prepare()

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path, config: TorchEngineConfig, static_decode: bool | None = None,
                        graphs: bool | None = None) -> QwenEngine:
        cfg = read_qwen3tts_config(model_dir)
        weights = {}
        from safetensors.torch import load_file

        for f in checkpoint.safetensors_files(model_dir):
            weights.update(load_file(str(f)))
        device = torch.device(config.device)
        return cls(load_qwen3tts(cfg, weights, config.max_seq_len, config.dtype, device), config, static_decode,
                   graphs)

    def _admitted(self, seq: FrameSequence) -> None:
        with torch.inference_mode():
            self.sampler.admit(seq)

    def _on_device(self) -> None:
        """None: a talker's rows are frames, stepped by :class:`StaticDecode` and the frame sampler."""
        return None

    # --- the contract ---------------------------------------------------------------------------

    def _sequence(self, request: FrameRequest, generator: torch.Generator) -> FrameSequence:
        """The request's state, its prompt rows and trailing text rows embedded once, on the device."""
        seq = FrameSequence(request=request, order=next(self._order), generator=generator)
        with torch.inference_mode():
            seq.rows = self.talker.prompt_rows(request.prompt, self.device)  # (L, H)
            trailing = list(request.prompt.trailing)
            seq.trailing = self.talker.text_rows(upload(trailing, self.device)) if trailing else None  # (n, H)
        return seq

    def _check(self, request: GenerationRequest) -> None:
        """ValueError for a request that can never run: not a frame request, a duplicate id, an empty
        prompt, ids outside the vocabularies, bad code-predictor sampling."""
        if not isinstance(request, FrameRequest):
            raise ValueError("a Qwen3-TTS engine runs frame requests (a prompt of rows), not token prompts")
        if request.request_id in self.slots.by_id:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        cfg = self.talker.cfg
        if not request.prompt.rows:
            raise ValueError("the prompt is empty")
        for text, codec in request.prompt.rows:
            if text is None and codec is None:
                raise ValueError("a prompt row has neither a text id nor a codec id")
            if text is not None and not 0 <= text < cfg.text_vocab_size:
                raise ValueError(f"text id {text} is outside the text vocabulary (0..{cfg.text_vocab_size - 1})")
            _check_codec(codec, request.prompt, cfg)
        bad = next((t for t in request.prompt.trailing if not 0 <= t < cfg.text_vocab_size), None)
        if bad is not None:
            raise ValueError(f"trailing text id {bad} is outside the text vocabulary (0..{cfg.text_vocab_size - 1})")
        code = request.code_sampling
        try:  # (the limits of the config's sampling section)
            SamplingParams(temperature=code.temperature, top_k=code.top_k, top_p=code.top_p).validate()
        except ValueError as e:
            raise ValueError(f"code predictor sampling: {e}") from None

    # --- run ------------------------------------------------------------------------------------

    def _build(self, decode: list[Sequence], prefill: list[tuple[Sequence, int]]
               ) -> tuple[ForwardBatch | StaticStep, list[Sequence]]:
        """The step's input rows: a decode row per decoding slot (its last frame + its text track),
        then each prompt chunk's rows; ids are placeholders (the model reads the rows). A decode-only
        step is a :class:`StaticStep` where static decoding is on."""
        seqs, rows = [], []
        for s in decode:
            seqs.append((s.slot, s.num_cached, [0], True))
            rows.append((s.frame_row + s.text_row(self.pad_row))[None])  # (1, H)
        if self.static is not None and decode and not prefill:
            step = StaticStep(torch.cat(rows), [s.slot for s in decode], [s.num_cached for s in decode])
            for s in decode:
                s.num_cached += 1
            return step, list(decode)
        samplers = list(decode)
        for s, n in prefill:
            done = s.num_cached + n == s.prompt_len
            seqs.append((s.slot, s.num_cached, [0] * n, done))
            rows.append(s.rows[s.num_cached : s.num_cached + n])  # (n, H)
            if done:
                samplers.append(s)
        batch = ForwardBatch.build(seqs, self.device)
        batch.embeds = torch.cat(rows)  # (T, H)
        for s in decode:
            s.num_cached += 1
        for s, n in prefill:
            s.num_cached += n
        return batch, samplers

    def _forward(self, batch: ForwardBatch | StaticStep) -> torch.Tensor:
        if isinstance(batch, StaticStep):
            return self.static(batch.rows, batch.slots, batch.positions)  # (N, H)
        return super()._forward(batch)

    def _start_sampling(self, seqs: list[FrameSequence], hidden: torch.Tensor) -> list[Sampled]:
        """A frame per sampling row (the frame sampler reads the device itself: codebook 0, then codes)."""
        return [Sampled(seqs, *self.sampler.sample(seqs, hidden))] if seqs else []

    # --- postprocess ----------------------------------------------------------------------------

    def _postprocess(self, seqs: list[FrameSequence], frames: list[Frame | None], logits, logit_ids
                     ) -> list[TokenDelta]:
        deltas = []
        for s, frame, lg, ids in zip(seqs, frames, logits, logit_ids, strict=True):
            self.total_tokens += 1
            if frame is None:
                reason, codes = "stop", []
            else:
                s.frame_done(frame.codes[0], frame.row)
                codes = frame.codes
                full = s.num_generated >= s.params.max_tokens or s.num_cached >= self.cfg.max_seq_len
                reason = "length" if full else "repetition" if s.repeating() else None
            deltas.append(self._delta(s, codes, reason, lg, ids))
        return deltas


def _check_codec(codec: object, prompt: TalkerPrompt, cfg: Qwen3TTSConfig) -> None:
    """ValueError unless ``codec`` is a row's codec track the talker can read."""
    if codec is None or (isinstance(codec, int) and 0 <= codec < cfg.talker.vocab_size):
        return
    if isinstance(codec, int):
        raise ValueError(f"codec id {codec} is outside the codec vocabulary (0..{cfg.talker.vocab_size - 1})")
    if isinstance(codec, tuple):
        if len(codec) != CODE_GROUPS or not all(isinstance(c, int) and 0 <= c < CODES for c in codec):
            raise ValueError(f"a reference frame must be {CODE_GROUPS} codes in 0..{CODES - 1}")
        return
    if codec != XVECTOR:
        raise ValueError(f"a prompt row's codec track {codec!r} is neither an id, a frame nor the x-vector")
    if prompt.speaker is None or prompt.speaker.shape != (cfg.hidden_size,):
        shape = None if prompt.speaker is None else prompt.speaker.shape
        raise ValueError(f"the prompt's x-vector is {shape}; this talker reads ({cfg.hidden_size},): a voice "
                         "enrolled with another checkpoint")
