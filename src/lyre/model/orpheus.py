"""The Orpheus token protocol: special ids, prompts, and audio token <-> SNAC code mapping.

Orpheus (canopylabs/orpheus-3b-0.1-ft) is a Llama decoder whose vocabulary extends Llama 3's
with special tokens from 128256 and 7 x 4096 audio tokens from 128266. The k-th generated audio
token (k counted from 0 over the whole generation) carries SNAC code

    code = id - 128266 - (k mod 7) * 4096,   valid iff 0 <= code < 4096

and frame j (tokens 7j..7j+6) fills the three SNAC codebooks as
    codebook 0 <- t0;  codebook 1 <- t1, t4;  codebook 2 <- t2, t3, t5, t6.
One frame decodes to 2048 samples at 24 kHz.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from lyre.errors import ControlTokenInText

# --- special ids (Llama 3 + Orpheus) ------------------------------------------------------------
BOS = 128000  # <|begin_of_text|>, added by the tokenizer
END_OF_TEXT = 128009  # <|eot_id|>
START_OF_SPEECH = 128257
END_OF_SPEECH = 128258  # the real stop token
START_OF_HUMAN = 128259
END_OF_HUMAN = 128260
START_OF_AI = 128261
END_OF_AI = 128262
PAD = 128263
AUDIO_TOKEN_OFFSET = 128266  # first audio id

TEXT_VOCAB_END = 128000  # text token ids are below this
CUSTOM_TOKEN_BASE = 128256  # id of <custom_token_0>
VOCAB_SIZE = 156940

CODEBOOK_SIZE = 4096
FRAME_TOKENS = 7
AUDIO_ID_END = AUDIO_TOKEN_OFFSET + FRAME_TOKENS * CODEBOOK_SIZE  # 156938, exclusive

STOP_IDS = (END_OF_SPEECH, END_OF_AI, END_OF_TEXT)
PROMPT_SUFFIX = (END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH)

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 2048  # SNAC hop 512 x 4 latent steps per Orpheus frame
TOKENS_PER_SECOND = FRAME_TOKENS * SAMPLE_RATE / SAMPLES_PER_FRAME  # 82.03: real time

VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
# OpenAI's voice names, spoken by the Orpheus voice nearest in register (model.voice_aliases), so
# clients that only know OpenAI's names (Pipecat's default "alloy", ...) get audio
OPENAI_VOICE_ALIASES = {"alloy": "tara", "ash": "leo", "ballad": "dan", "coral": "leah", "echo": "zac",
                        "fable": "jess", "nova": "mia", "onyx": "dan", "sage": "zoe", "shimmer": "leah",
                        "verse": "leo", "marin": "mia", "cedar": "zac"}
# Riva's voice names ("English-US.Female-1") for the same voices, by gender as Riva numbers them
RIVA_SUBVOICES = {"Female-1": "tara", "Female-2": "leah", "Female-3": "jess", "Female-4": "mia", "Female-5": "zoe",
                  "Male-1": "leo", "Male-2": "dan", "Male-3": "zac"}
# Riva's current voices (NVIDIA Magpie; Pipecat's NvidiaTTSService asks for the first by default)
# -> Orpheus voices of the same kind. Names with an emotion after them (".Calm", ...) take the voice.
RIVA_VOICE_ALIASES = {f"Magpie-Multilingual.EN-US.{name}": voice for name, voice in (
    ("Aria", "tara"), ("Sofia", "leah"), ("Louise", "jess"), ("Mia", "mia"), ("Isabela", "zoe"),
    ("Leo", "leo"), ("Jason", "dan"), ("Ray", "zac"), ("Diego", "leo"), ("Pascal", "dan"))}
EMOTION_TAGS = ("<laugh>", "<chuckle>", "<sigh>", "<cough>", "<sniffle>", "<groan>", "<yawn>", "<gasp>")

# Frame slot s of a frame (0..6) -> (codebook, position of the slot within that codebook's codes
# of the frame). Codebook 1 has 2 codes per frame, codebook 2 has 4.
SLOT_CODEBOOK = (0, 1, 2, 2, 1, 2, 2)
_C1_SLOTS = [1, 4]
_C2_SLOTS = [2, 3, 5, 6]
_SLOT_OFFSETS = AUDIO_TOKEN_OFFSET + CODEBOOK_SIZE * np.arange(FRAME_TOKENS, dtype=np.int64)

Frame = tuple[int, int, int, int, int, int, int]  # the 7 SNAC codes of one Orpheus frame


class TextTokenizer(Protocol):
    """``tokenizers.Tokenizer`` (encode -> Encoding with .ids) or a transformers tokenizer."""

    def encode(self, text: str) -> Any: ...


# --- single tokens ------------------------------------------------------------------------------


def audio_token_id(code: int, k: int) -> int:
    """Token id of SNAC ``code`` as the k-th audio token of a generation."""
    if not 0 <= code < CODEBOOK_SIZE:
        raise ValueError(f"SNAC code {code} is out of range 0..{CODEBOOK_SIZE - 1}")
    return AUDIO_TOKEN_OFFSET + (k % FRAME_TOKENS) * CODEBOOK_SIZE + code


def audio_code(token_id: int, k: int) -> int | None:
    """SNAC code of ``token_id`` as the k-th audio token, or None when it is not valid there."""
    code = token_id - AUDIO_TOKEN_OFFSET - (k % FRAME_TOKENS) * CODEBOOK_SIZE
    return code if 0 <= code < CODEBOOK_SIZE else None


def is_audio_id(token_id: int) -> bool:
    return AUDIO_TOKEN_OFFSET <= token_id < AUDIO_ID_END


# --- prompts ------------------------------------------------------------------------------------


def encode_text(tokenizer: TextTokenizer, text: str) -> list[int]:
    """Token ids of ``text`` starting with exactly one BOS."""
    encoded = tokenizer.encode(text)
    ids = [int(i) for i in getattr(encoded, "ids", encoded)]
    if not ids or ids[0] != BOS:
        ids.insert(0, BOS)
    return ids


CONTROL_TAIL = 64  # characters: longer than any control token of the vocabulary (the longest has 30)


@dataclass(frozen=True)
class ControlToken:
    """A span of text that the tokenizer reads as one of the model's control tokens."""

    name: str
    start: int  # character offsets in the text checked (-1: not known)
    end: int

    def refusal(self, what: str = "text") -> str:
        where = f" at characters {self.start}-{self.end}" if self.start >= 0 else ""
        return (f"{what} contains {self.name!r}{where}, which the model reads as a control token: text can "
                "only be spoken, never steer the prompt; remove it")


def control_token(tokenizer: TextTokenizer, text: str) -> ControlToken | None:
    """The first span of ``text`` that the tokenizer reads as a control token (id >= TEXT_VOCAB_END:
    ``<|eot_id|>``, ``<custom_token_5>``, ...), found by the tokenizer itself, so exactly what it
    would match; None when there is none."""
    encoded = tokenizer.encode(text)
    ids = [int(i) for i in getattr(encoded, "ids", encoded)]
    offsets = getattr(encoded, "offsets", None) or [(-1, -1)] * len(ids)
    for i, (token, (start, end)) in enumerate(zip(ids, offsets, strict=True)):
        if token < TEXT_VOCAB_END or (i == 0 and token == BOS and start == end):
            continue  # text, or the BOS the tokenizer adds (no character of the text spells it)
        name = tokenizer.id_to_token(token) if hasattr(tokenizer, "id_to_token") else str(token)
        return ControlToken(str(name), start, end)
    return None


def build_prompt_ids(tokenizer: TextTokenizer, text: str, voice: str | None = None) -> list[int]:
    """``[start_of_human] tok("{voice}: {text}") [eot end_of_human start_of_ai start_of_speech]``.

    Submit these ids to the engine as they are: decoding and re-tokenising them adds a second BOS.
    Text that spells a control token (``<|eot_id|>``, ``<custom_token_5>``...) is refused
    (ValueError, naming it and where): the tokenizer would turn it into that token and let the
    input steer the prompt.
    """
    if not text or not text.strip():
        raise ValueError("text is empty: there is nothing to speak")
    if (found := control_token(tokenizer, text)) is not None:
        raise ControlTokenInText(found.refusal())
    content = f"{voice}: {text}" if voice else text
    ids = encode_text(tokenizer, content)
    control = next((i for i in ids[1:] if i >= TEXT_VOCAB_END), None)
    if control is not None:  # (the voice's name and the text together: never, with a checked voice)
        name = tokenizer.id_to_token(control) if hasattr(tokenizer, "id_to_token") else str(control)
        raise ValueError(ControlToken(str(name), -1, -1).refusal())
    return [START_OF_HUMAN, *ids, *PROMPT_SUFFIX]


def build_reference_ids(tokenizer: TextTokenizer, ref_text: str, ref_audio_ids: Sequence[int]) -> list[int]:
    """The reference turn of a cloning prompt: ``[start_of_human] tok(ref_text) [eot end_of_human
    start_of_ai start_of_speech] ref_audio_ids [end_of_speech end_of_ai]`` — the same for every
    request with that voice, so its K/V can be computed once and kept.

    ``ref_audio_ids`` are the audio token ids of the reference recording (whole frames), e.g.
    ``codes_to_token_ids(*snac.encode(audio))``.
    """
    token_ids_to_codes(ref_audio_ids)  # validates whole, well-formed frames
    if not ref_text or not ref_text.strip():
        raise ValueError("ref_text is empty: cloning needs the transcript of the reference audio")
    reference = [START_OF_HUMAN, *encode_text(tokenizer, ref_text), *PROMPT_SUFFIX]
    return [*reference, *map(int, ref_audio_ids), END_OF_SPEECH, END_OF_AI]


def build_clone_prompt_ids(
    tokenizer: TextTokenizer, text: str, ref_text: str, ref_audio_ids: Sequence[int]
) -> list[int]:
    """Zero-shot cloning prompt for the pretrained model: the reference turn, then the new text
    (without a voice name)."""
    return [*build_reference_ids(tokenizer, ref_text, ref_audio_ids), *build_prompt_ids(tokenizer, text)]


# --- whole sequences ----------------------------------------------------------------------------


def _flat_codes(x: Any, name: str) -> np.ndarray:
    """A 1-D int64 array from a list, numpy array or torch tensor (a leading batch of 1 is dropped)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (or shape (1, n)), got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def frames_to_codes(frames: np.ndarray | Sequence[Frame]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(T, 7) frame codes -> SNAC codebooks c0 (T,), c1 (2T,), c2 (4T,)."""
    f = np.asarray(frames, dtype=np.int64).reshape(-1, FRAME_TOKENS)  # (T, 7)
    return f[:, 0].copy(), f[:, _C1_SLOTS].reshape(-1), f[:, _C2_SLOTS].reshape(-1)


def codes_to_frames(c0: Any, c1: Any, c2: Any) -> np.ndarray:
    """SNAC codebooks c0 (T,), c1 (2T,), c2 (4T,) -> (T, 7) frame codes, validated."""
    a0, a1, a2 = _flat_codes(c0, "c0"), _flat_codes(c1, "c1"), _flat_codes(c2, "c2")
    t = a0.shape[0]
    if a1.shape[0] != 2 * t or a2.shape[0] != 4 * t:
        raise ValueError(
            f"codebook lengths must be T, 2T, 4T; got {a0.shape[0]}, {a1.shape[0]}, {a2.shape[0]}"
        )
    for name, arr in (("c0", a0), ("c1", a1), ("c2", a2)):
        bad = np.flatnonzero((arr < 0) | (arr >= CODEBOOK_SIZE))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{name}[{i}] = {int(arr[i])} is not a SNAC code (0..{CODEBOOK_SIZE - 1})")
    frames = np.empty((t, FRAME_TOKENS), dtype=np.int64)  # (T, 7)
    frames[:, 0] = a0
    frames[:, _C1_SLOTS] = a1.reshape(t, 2)
    frames[:, _C2_SLOTS] = a2.reshape(t, 4)
    return frames


def codes_to_token_ids(c0: Any, c1: Any, c2: Any) -> list[int]:
    """SNAC codes (c0 (T,), c1 (2T,), c2 (4T,)) -> the 7T audio token ids, frame by frame."""
    frames = codes_to_frames(c0, c1, c2)  # (T, 7)
    return (frames + _SLOT_OFFSETS).reshape(-1).tolist()


def token_ids_to_codes(ids: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Audio token ids (whole frames, k counted from 0) -> (c0 (T,), c1 (2T,), c2 (4T,)).

    Raises ValueError naming the first position whose id is not valid for its frame slot.
    """
    arr = _flat_codes(ids, "ids")
    if arr.size % FRAME_TOKENS:
        raise ValueError(f"{arr.size} ids are not whole frames: the count must be a multiple of {FRAME_TOKENS}")
    codes = arr.reshape(-1, FRAME_TOKENS) - _SLOT_OFFSETS  # (T, 7)
    bad = np.flatnonzero(((codes < 0) | (codes >= CODEBOOK_SIZE)).reshape(-1))
    if bad.size:
        k = int(bad[0])
        slot = k % FRAME_TOKENS
        lo = int(_SLOT_OFFSETS[slot])
        raise ValueError(
            f"position {k}: id {int(arr[k])} is not a valid audio token for frame slot {slot} "
            f"(valid ids {lo}..{lo + CODEBOOK_SIZE - 1})"
        )
    return frames_to_codes(codes)


# --- streaming ----------------------------------------------------------------------------------


@dataclass
class ParserStats:
    audio_tokens: int = 0  # ids in the audio range, valid or not: k of the next one
    frames: int = 0  # complete valid frames emitted
    invalid_tokens: int = 0  # audio-range ids whose code is wrong for their frame slot
    dropped_frames: int = 0  # frames not emitted because they hold an invalid token
    non_audio_tokens: int = 0  # text or special ids among the generated ids (skipped)
    after_stop: int = 0  # ids that arrived after the stop id (ignored)


class AudioTokenParser:
    """Turns generated ids, fed one or many at a time, into complete SNAC frames.

    Slot parity follows the absolute audio index k: an audio-range id whose code is wrong for its
    slot still occupies that slot (its frame is dropped and counted), so one bad token never
    shifts the frames after it. Ids outside the audio range are counted and skipped. Any stop id
    (end-of-speech first of all) ends the stream; later ids are counted and ignored.
    """

    def __init__(self) -> None:
        self.stats = ParserStats()
        self.stop_id: int | None = None
        self._codes = [0] * FRAME_TOKENS
        self._frame_invalid = False

    @property
    def finished(self) -> bool:
        return self.stop_id is not None

    @property
    def pending_tokens(self) -> int:
        """Audio tokens of the current, incomplete frame."""
        return self.stats.audio_tokens % FRAME_TOKENS

    def feed(self, ids: Iterable[int]) -> list[Frame]:
        """Consume ``ids``; return the frames they complete, in order."""
        out: list[Frame] = []
        st = self.stats
        for tid in ids:
            tid = int(tid)
            if self.stop_id is not None:
                st.after_stop += 1
            elif tid in STOP_IDS:
                self.stop_id = tid
            elif not AUDIO_TOKEN_OFFSET <= tid < AUDIO_ID_END:
                st.non_audio_tokens += 1
            else:
                slot = st.audio_tokens % FRAME_TOKENS
                st.audio_tokens += 1
                code = tid - AUDIO_TOKEN_OFFSET - slot * CODEBOOK_SIZE
                if 0 <= code < CODEBOOK_SIZE:
                    self._codes[slot] = code
                else:
                    st.invalid_tokens += 1
                    self._frame_invalid = True
                if slot == FRAME_TOKENS - 1:
                    if self._frame_invalid:
                        st.dropped_frames += 1
                    else:
                        out.append(tuple(self._codes))  # type: ignore[arg-type]
                        st.frames += 1
                    self._frame_invalid = False
        return out
