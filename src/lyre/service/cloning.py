"""What a model family makes of an enrollment clip, and of a stored voice at request time
(:class:`~lyre.service.voices.Voices` holds the registry, consent, limits and caches; these hold
the encoders).

- :class:`OrpheusCloning`: the clip encoded with SNAC into Orpheus reference tokens; the
  transcript is required; a voice is a reference turn of token ids (DESIGN.md section 3).
- :class:`QwenCloning` (Qwen3-TTS Base): the clip's x-vector from the checkpoint's speaker
  encoder, always; with a transcript, reference-transcript mode: the clip's frames from the 12 Hz
  tokenizer's encoder too (the reference's ``create_voice_clone_prompt``). Without one, x-vector
  mode. A voice is a :class:`~lyre.model.qwen3tts.CloneReference`.

``encode`` runs in the enrollment workers (blocking, one at a time beside the codec); the rest is cheap.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lyre.errors import InvalidRequest, LyreError
from lyre.model import orpheus
from lyre.model.qwen3tts import CloneReference
from lyre.storage.registry import Voice

log = logging.getLogger("lyre.voices")

MAX_TRANSCRIPT_CHARS = 5000


@dataclass(frozen=True)
class Encoded:
    codes: list[int]  # what the registry stores as the clip's codes
    speaker_embedding: bytes | None = None


def weights_id(kind: str, *paths: Path) -> str:
    """The identity of codec (and encoder) weights: a clip's codes mean something only to the weights
    that made them. Each path a directory (its config and weights files) or a file."""
    digest = hashlib.sha256()
    for path in paths:
        files = [path] if path.is_file() else [path / n for n in ("config.json", "model.safetensors",
                                                                   "pytorch_model.bin")]
        for f in files:
            if f.is_file():
                with f.open("rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):  # noqa: B023
                        digest.update(block)
    return f"{kind}-sha256:{digest.hexdigest()[:16]}"


def _transcript(transcript: Any, required: bool) -> str:
    if transcript is None or (isinstance(transcript, str) and not transcript.strip() and not required):
        if required:
            raise InvalidRequest("'transcript' is required: the exact words spoken in the clip")
        return ""
    if not isinstance(transcript, str) or not transcript.strip():
        raise InvalidRequest("'transcript' is required: the exact words spoken in the clip")
    transcript = " ".join(transcript.split())
    if len(transcript) > MAX_TRANSCRIPT_CHARS:
        raise InvalidRequest(f"'transcript' has {len(transcript)} characters; at most {MAX_TRANSCRIPT_CHARS}")
    return transcript


class OrpheusCloning:
    positions_per_second = orpheus.TOKENS_PER_SECOND
    needs_transcript = True

    def __init__(self, snac: Any, tokenizer: Any, snac_dir: Path):
        self.snac, self.tokenizer = snac, tokenizer
        self.device = next(snac.parameters()).device
        self.codec_id = weights_id("snac", Path(snac_dir))
        self._lock = threading.Lock()  # one SNAC encode at a time beside the codec

    def check_transcript(self, transcript: Any) -> str:
        transcript = _transcript(transcript, required=True)
        try:
            orpheus.build_prompt_ids(self.tokenizer, transcript)  # control tokens, lone surrogates, ...
        except (ValueError, UnicodeError) as e:
            raise InvalidRequest(f"'transcript' is not usable: {e}") from None
        return transcript

    def encode(self, pcm: np.ndarray, transcript: str) -> Encoded:
        """Orpheus reference token ids of a 24 kHz clip (SNAC encode, frame order of DESIGN.md section 3)."""
        import torch

        with self._lock, torch.inference_mode():
            x = torch.from_numpy(pcm).to(self.device, next(self.snac.parameters()).dtype)[None, None]  # (1, 1, N)
            c0, c1, c2 = self.snac.encode(x)  # (1, T), (1, 2T), (1, 4T)
        return Encoded(orpheus.codes_to_token_ids(c0[0], c1[0], c2[0]))

    def size(self, transcript: str, encoded: Encoded) -> int:
        """Positions of a slot the voice's reference turn takes."""
        return len(orpheus.build_reference_ids(self.tokenizer, transcript, encoded.codes))

    def reference(self, key: str, voice: Voice) -> list[int]:
        return orpheus.build_reference_ids(self.tokenizer, voice.transcript, voice.ref_token_ids)


class QwenCloning:
    positions_per_second = 12.5  # a reference frame per row
    needs_transcript = False  # without one: x-vector mode

    def __init__(self, family: Any, tokenizer: Any, model_dir: Path, speech_dir: Path, weights: dict[str, Any]):
        from lyre.model.qwen3tts.speaker import load_speaker_encoder

        cfg = family.cfg
        if cfg.speaker_encoder is None:
            raise LyreError("this Qwen3-TTS checkpoint has no speaker encoder (only Base checkpoints clone voices)")
        try:
            self.speaker = load_speaker_encoder(cfg.speaker_encoder, weights)
        except ValueError as e:
            raise LyreError(f"{model_dir}: {e}") from None
        self.family, self.tokenizer, self.speech_dir = family, tokenizer, Path(speech_dir)
        self._encoder: Any = None  # the 12 Hz tokenizer's encoder: loaded at the first transcript
        self._encoder_error: str | None = None  # why it could not be loaded (not tried again)
        self._lock = threading.Lock()
        digest = hashlib.sha256(b"".join(v.float().numpy().tobytes() for _, v in sorted(
            (k, w) for k, w in weights.items() if k.startswith("speaker_encoder.")))).hexdigest()[:8]
        self.codec_id = weights_id("qwen12hz", self.speech_dir) + f"+spk:{digest}"

    def check_transcript(self, transcript: Any) -> str:
        """The transcript, or "" (x-vector mode); InvalidRequest for one the text tokenizer refuses."""
        transcript = _transcript(transcript, required=False)
        if transcript:
            self._text_ids(transcript)
        return transcript

    def _text_ids(self, transcript: str) -> list[int]:
        try:
            return self.family.text_ids(self.tokenizer, transcript, "transcript")
        except (ValueError, UnicodeError) as e:
            raise InvalidRequest(f"'transcript' is not usable: {e}") from None

    def encode(self, pcm: np.ndarray, transcript: str) -> Encoded:
        """The clip's x-vector and, with a transcript, its frames (16 codes each, flattened)."""
        from lyre.codec.qwen12hz.encoder import load_reference_encoder

        with self._lock:
            xvector = self.speaker.embed(pcm)
            codes: list[int] = []
            if transcript:
                if self._encoder is None and self._encoder_error is None:
                    try:
                        self._encoder = load_reference_encoder(self.speech_dir)
                    except Exception as e:  # noqa: BLE001 - missing, unreadable or unfit files, no transformers
                        self._encoder_error = f"{type(e).__name__}: {e}"[:400]
                        log.error("the 12 Hz tokenizer's encoder could not be loaded from %s: %s", self.speech_dir,
                                  self._encoder_error)
                if self._encoder is None:
                    raise InvalidRequest(f"this server cannot clone from a transcript (the 12 Hz tokenizer's encoder "
                                         f"could not be loaded: {self._encoder_error}); enroll the clip without one "
                                         "(x-vector mode)")
                codes = self._encoder.encode(pcm).ravel().tolist()
        return Encoded(codes, xvector.astype(np.float32).tobytes())

    def size(self, transcript: str, encoded: Encoded) -> int:
        """Rows of a slot the voice's own rows take (its transcript beside its frames, or none)."""
        return len(encoded.codes) // 16 + 1 if transcript else 0  # (codec_bos, then a row per frame)

    def reference(self, key: str, voice: Voice) -> CloneReference:
        if voice.speaker_embedding is None:
            raise InvalidRequest(f"voice {voice.id} has no x-vector: it was enrolled for another model; enroll it "
                                 "again")
        xvector = np.frombuffer(voice.speaker_embedding, dtype=np.float32).copy()
        frames = np.asarray(voice.ref_token_ids, dtype=np.int64).reshape(-1, 16)
        text = tuple(self._text_ids(voice.transcript)) if voice.transcript and len(frames) else ()
        return CloneReference(key, xvector, text, tuple(map(tuple, frames.tolist())) if text else ())
