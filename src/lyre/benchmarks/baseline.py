"""The peer for ``benchmark.py --baseline transformers``: Orpheus served the simplest way users do it
today — ``transformers`` ``generate`` for the whole utterance, then one SNAC decode of every frame,
one request at a time — behind Lyre's own front ends, so both are measured through the same protocol.

Start it with ``production_server.py --baseline transformers``. It exists to be compared against;
it is not a serving mode.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import numpy as np
import torch

from lyre.benchmarks.peer.common import PeerStream, peer_stats
from lyre.codec import configure_noise
from lyre.core.stats import SessionMetrics, StatsSnapshot
from lyre.engine.backend import BackendChoice
from lyre.errors import SynthesisFailed
from lyre.model import checkpoint, orpheus
from lyre.service.stream import AudioChunk, to_int16
from lyre.service.tts import TTSService


def _audio_constraint(prompt_len: int):
    """A transformers LogitsProcessor with Lyre's ``constrain_audio`` rule, so both sides of the
    comparison sample the same kind of tokens: only the 4096 ids of the current frame slot, plus
    end-of-speech at frame boundaries."""
    from transformers import LogitsProcessor

    class AudioConstraint(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            k = input_ids.shape[1] - prompt_len
            lo = orpheus.AUDIO_TOKEN_OFFSET + (k % orpheus.FRAME_TOKENS) * orpheus.CODEBOOK_SIZE
            masked = torch.full_like(scores, float("-inf"))
            masked[:, lo : lo + orpheus.CODEBOOK_SIZE] = scores[:, lo : lo + orpheus.CODEBOOK_SIZE]
            if k % orpheus.FRAME_TOKENS == 0:
                masked[:, orpheus.END_OF_SPEECH] = scores[:, orpheus.END_OF_SPEECH]
            return masked

    return AudioConstraint()


class _BaselineStream(PeerStream):
    def __init__(self, service: TransformersBaseline, prompts: list[list[int]], sampling: dict[str, Any]):
        super().__init__(service, prompts, sampling, "b")
        self._done = False

    async def __anext__(self) -> AudioChunk:
        if self._done or self._cancelled:
            raise StopAsyncIteration
        self._done = True
        async with self._service.lock:  # one request at a time
            if self._cancelled:
                raise StopAsyncIteration
            try:
                pcm, tokens = await asyncio.to_thread(self._service.generate, self._prompts, self._sampling)
            except Exception as e:
                raise SynthesisFailed(f"{type(e).__name__}: {e}") from None
        elapsed = time.monotonic() - self._created
        seconds = len(pcm) / orpheus.SAMPLE_RATE
        self.metrics = SessionMetrics(ttfb_ms=1000 * elapsed, tokens=tokens, prompt_tokens=sum(map(len, self._prompts)),
                                      audio_seconds=seconds, elapsed_s=elapsed,
                                      real_time_factor=elapsed / seconds if seconds else None, chunks=1, late_chunks=0,
                                      segments=len(self._prompts))
        return AudioChunk(pcm=pcm, sample_rate=orpheus.SAMPLE_RATE, offset_samples=0, index=0,
                          elapsed_ms=1000 * elapsed, late=False)

    def cancel(self) -> None:
        self._cancelled = True

    async def aclose(self) -> None:
        self.cancel()


class TransformersBaseline(TTSService):
    """Same validation and API as ``TTSService``; generation is ``transformers`` + one SNAC decode."""

    def _load(self) -> None:
        import transformers

        cfg = self.config
        self.model = checkpoint.resolve_model(cfg.model, cfg.codec)
        self.tokenizer = checkpoint.load_tokenizer(self.model.llama_dir)
        self.device = "cuda" if torch.cuda.is_available() and cfg.model.device != "cpu" else "cpu"
        dtype = torch.float16 if self.device == "cuda" else torch.float32
        self.hf = transformers.LlamaForCausalLM.from_pretrained(self.model.llama_dir, dtype=dtype).to(self.device).eval()
        self.snac = configure_noise(checkpoint.load_snac(self.model.snac_dir, self.device), cfg.codec.noise,
                                    cfg.codec.noise_seed)
        self.lock = asyncio.Lock()
        self.total_sessions = self.total_tokens = self.total_batches = 0
        self._ids = itertools.count()
        self._running = True
        self.backend = BackendChoice("transformers", f"the benchmark peer: transformers generate on {self.device}, "
                                                     "one request at a time")

    async def __aenter__(self) -> TransformersBaseline:
        await asyncio.to_thread(self._load)
        return self

    async def aclose(self) -> None:
        self._running = False

    @property
    def ready(self) -> bool:
        return getattr(self, "_running", False)

    def stream(self, text: str, voice: str | None = None, *, account: str = "default", protocol: str = "library",
               audit: Any = None, mark: Any = None, tempo: float = 1.0, **sampling: Any) -> _BaselineStream:
        """(Built-in voices only; nothing is audited or watermarked: the peer has no registry, audit trail
        or watermark, as the servers it stands for; it paces nothing, so ``tempo`` means nothing to it.)"""
        segments, params, _ = self._prepare(text, self._voice(voice, account), sampling, account)
        self.total_sessions += 1
        return _BaselineStream(self, [s.prompt for s in segments], params.__dict__)

    def generate(self, prompts: list[list[int]], p: dict[str, Any]) -> tuple[np.ndarray, int]:
        """Whole-utterance generation and decode (runs in a worker thread, one at a time)."""
        audio, tokens = [], 0
        for prompt in prompts:
            if p.get("seed") is not None:
                torch.manual_seed(p["seed"])
            with torch.inference_mode():
                out = self.hf.generate(
                    torch.tensor([prompt], device=self.device),
                    attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=self.device),
                    max_new_tokens=p["max_tokens"], min_new_tokens=p["min_tokens"] or None,
                    do_sample=p["temperature"] > 0,
                    temperature=p["temperature"] or None, top_p=p["top_p"], top_k=p["top_k"] or None,
                    repetition_penalty=p["repetition_penalty"], eos_token_id=list(orpheus.STOP_IDS),
                    pad_token_id=orpheus.PAD,
                    logits_processor=[_audio_constraint(len(prompt))] if p["constrain_audio"] else None)
            generated = out[0, len(prompt):].tolist()
            tokens += len(generated)
            self.total_batches += len(generated)
            frames = orpheus.AudioTokenParser().feed(generated)
            if frames:
                codes = [torch.from_numpy(c)[None].to(self.device) for c in orpheus.frames_to_codes(frames)]
                with torch.inference_mode():
                    audio.append(self.snac.decode(codes)[0, 0].float().cpu().numpy())
        self.total_tokens += tokens
        pcm = to_int16(np.concatenate(audio)) if audio else np.zeros(0, dtype=np.int16)
        return pcm, tokens

    def stats(self) -> StatsSnapshot:
        busy = int(self.lock.locked())
        return peer_stats("transformers", "one at a time", 1, busy, 0, self.total_sessions, self.total_tokens,
                          self.total_batches)
