"""The engine's state of one admitted request (its slot, how much of it is cached, where it is in
its audio frames, its random generator and its recent tokens), and the pool of KV slots the
requests hold. Both are owned by the engine thread."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import torch

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.model import orpheus


@dataclass(eq=False)
class Sequence:
    """The engine's state of one admitted request (owned by the engine thread)."""

    request: GenerationRequest
    order: int  # admission order: the default decode order and the prefill tie-break
    generator: torch.Generator
    seed: int = 0  # its sampling seed (the request's, or drawn at admission): the on-device draws' too
    slot: int = -1
    num_cached: int = 0  # tokens whose K/V are in the slot
    num_generated: int = 0
    audio_k: int | None = None  # index of the next audio token; None before start-of-speech
    next_input: int = -1  # token to feed at the next decode step
    cancelled: bool = False
    prefix_kept: bool = False  # its prefix is in the prefix cache (found there, or put there)
    on_device: bool = False  # decoded and sampled by the engine's on-device audio step (audio_step.py)
    # its next token is computed ahead, by the step the engine launched at the end of its last step (its K/V
    # written, num_cached advanced); read back into ``ahead_token`` (and its logits when it records them)
    ahead: bool = False
    ahead_token: tuple | None = None  # (token, logits, logit ids) read back, not yet delivered
    generated_window: deque[int] = field(default_factory=deque)  # last repetition_window tokens

    @property
    def params(self) -> SamplingParams:
        return self.request.sampling

    @property
    def prompt_len(self) -> int:
        return self.request.prompt_len

    @property
    def prefilling(self) -> bool:
        return self.num_cached < self.prompt_len

    @property
    def constrained(self) -> bool:
        return self.params.constrain_audio and self.audio_k is not None

    def generated(self, token: int) -> None:
        """``token`` was sampled: it is the next input, joins the penalty's window, and counts as an
        audio token (or starts the audio, at start-of-speech)."""
        self.num_generated += 1
        self.next_input = token
        p = self.params
        if p.repetition_penalty != 1.0:
            self.generated_window.append(token)
            if p.repetition_window and len(self.generated_window) > p.repetition_window:
                self.generated_window.popleft()
        if self.audio_k is not None and orpheus.is_audio_id(token):
            self.audio_k += 1
        elif self.audio_k is None and token == orpheus.START_OF_SPEECH:
            self.audio_k = 0


class SlotPool:
    """The KV cache's slots and the sequences holding them: the lowest free slot is handed out first,
    and a sequence holds its slot from admission until it finishes (the pool alone hands slots out
    and takes them back)."""

    def __init__(self, slots: int):
        self._free = list(range(slots))  # a heap: lowest slot first
        self.by_slot: dict[int, Sequence] = {}
        self.by_id: dict[str, Sequence] = {}  # request id -> sequence, every one holding a slot

    @property
    def free(self) -> int:
        return len(self._free)

    def admit(self, seq: Sequence) -> None:
        """Give ``seq`` the lowest free slot (the caller has checked that one is free)."""
        seq.slot = heapq.heappop(self._free)
        self.by_slot[seq.slot] = seq
        self.by_id[seq.request.request_id] = seq

    def release(self, seq: Sequence) -> None:
        """Take ``seq``'s slot back (once: a sequence already released is left as it is)."""
        self.by_id.pop(seq.request.request_id, None)
        if seq.slot >= 0 and self.by_slot.get(seq.slot) is seq:
            del self.by_slot[seq.slot]
            heapq.heappush(self._free, seq.slot)
        seq.slot = -1
