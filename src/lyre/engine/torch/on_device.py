"""What of a :class:`~lyre.engine.torch.engine.TorchEngine` runs on the device over static shapes (on a
GPU: CUDA graphs, all captured when the engine starts): the audio rows' decode step
(:mod:`~lyre.engine.torch.audio_step`), whole prompts' prefill step with their first tokens
(:mod:`~lyre.engine.torch.prefill_step`), and the audio rows' next step, launched ahead at the end of
every engine step and read back with the next one. Owned by the engine thread."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from lyre.cpu import LEDGER
from lyre.engine.torch.audio_step import AudioPending, AudioStep
from lyre.engine.torch.config import TorchEngineConfig
from lyre.engine.torch.llama import KVCache, Llama
from lyre.engine.torch.prefill_step import PrefillStep
from lyre.engine.torch.sequence import Sequence
from lyre.engine.torch.slot_sampling import SlotSampling, audio_head

log = logging.getLogger("lyre.engine")


class OnDevice:
    def __init__(self, model: Llama, cache: KVCache, cfg: TorchEngineConfig, device: torch.device):
        """Its steps, their CUDA graphs captured now on a GPU unless ``engine.cuda_graphs`` is off
        (GraphCaptureError: the bucket that failed)."""
        graphs = cfg.cuda_graphs and device.type == "cuda"
        sampling = SlotSampling(cfg.slots, cfg.max_seq_len, device, audio_head(model))
        self.audio = AudioStep(model, cache, sampling, graphs=graphs)
        self.prefill = PrefillStep(model, cache, sampling, cfg.max_prefill_tokens, graphs=graphs)
        self.in_flight: AudioPending | None = None  # the audio rows' step launched ahead, not read back yet
        if graphs:
            with torch.inference_mode():
                self.prefill.prepare()
                self.audio.prepare()

    def admit(self, seq: Sequence) -> None:
        """A request constrained from its first token (its prompt ends with start-of-speech) is an audio
        row: sampled here, its sampling written into its slot."""
        if seq.constrained and seq.audio_k == 0 and seq.prompt_len:
            seq.on_device = True
            with torch.inference_mode():
                self.audio.sampling.admit(seq.slot, seq.params)

    def whole_prompts(self, prefill: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """The chunks of ``prefill`` its prefill step takes this step: whole prompts, as many as fit."""
        whole = [(s, n) for s, n in prefill if PrefillStep.takes(s, n)]
        return whole[: self.prefill.fits([s for s, _ in whole])]

    def flight(self) -> AudioPending | None:
        """The step launched ahead, its outputs copied (before any other replay can overwrite them)."""
        return self.in_flight.detached() if self.in_flight is not None else None

    def landed(self, flight: AudioPending, tokens: list, logits: list, logit_ids: list) -> int:
        """``flight``'s rows' tokens (the first of those read back) are kept on them until asked for;
        returns how many of the read-back values were theirs."""
        self.in_flight = None
        n = len(flight.seqs)
        for s, *ahead in zip(flight.seqs, tokens[:n], logits[:n], logit_ids[:n], strict=True):
            s.ahead_token = tuple(ahead)
        return n

    def launch_ahead(self, live: Iterable[Sequence]) -> None:
        """Start the next step of every audio row of ``live`` without a token computed ahead, and do not
        wait for it: the device computes it while the engine's caller handles this step's tokens (a
        row's next input is the token just delivered and its draw a function of its seed and count, so
        nothing the caller decides changes it). A launch that fails is logged; those rows then decode
        in the next step as usual."""
        if self.in_flight is not None:
            return
        rows = [s for s in live
                if s.on_device and not s.ahead and not s.prefilling and not s.cancelled and s.num_generated > 0]
        if not rows:
            return
        try:
            with torch.inference_mode(), LEDGER.measure("model"):
                self.in_flight = self.audio(rows)
        except Exception:  # noqa: BLE001 - they decode in the next step, where a fault finds its request
            log.exception("launching the next step of %d audio rows failed", len(rows))
            return
        for s in rows:
            s.ahead = True
            s.num_cached += 1
