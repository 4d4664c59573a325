"""A Qwen3-TTS checkpoint's ``config.json``: the talker and code predictor shapes, the control ids,
languages and speakers.

The control ids are read from the file, never from the reference classes' defaults (those lie
outside the 3072-id codec vocabulary). A file that is not a Qwen3-TTS config, or lacks a field
the engine needs, is refused naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lyre.errors import CheckpointError
from lyre.model.checkpoint.llama import LlamaConfig, read_config_json
from lyre.model.qwen3tts.speaker import SpeakerEncoderConfig

CODE_GROUPS = 16  # codebooks per frame: codebook 0 from the talker, 1-15 from the code predictor
CODES = 2048  # codes per codebook; talker ids from 2048 are control, language and speaker ids
MODEL_TYPES = ("base", "custom_voice", "voice_design")
CODEC_ID_FIELDS = ("codec_pad_id", "codec_bos_id", "codec_eos_token_id", "codec_think_id", "codec_nothink_id",
                   "codec_think_bos_id", "codec_think_eos_id")
TEXT_ID_FIELDS = ("tts_bos_token_id", "tts_eos_token_id", "tts_pad_token_id", "im_start_token_id", "im_end_token_id")
DECODER_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim")


@dataclass(frozen=True)
class CodecIds:
    pad: int
    bos: int
    eos: int  # the talker's end of speech (sampled as codebook 0)
    think: int
    nothink: int
    think_bos: int
    think_eos: int


@dataclass(frozen=True)
class TextIds:
    tts_bos: int
    tts_eos: int
    tts_pad: int
    im_start: int
    im_end: int
    assistant: int = 77091  # "assistant" in Qwen's vocabulary (config.json's assistant_token_id)
    newline: int = 198  # "\n" in Qwen's vocabulary
    special_start: int = 151643  # <|endoftext|>: every id from here is a special token


@dataclass(frozen=True)
class Qwen3TTSConfig:
    model_type: str  # base | custom_voice | voice_design
    model_size: str  # 0b6 | 1b7 (as config.json writes it)
    talker: LlamaConfig  # Qwen3 decoder over the codec vocabulary (3072): codec_embedding in, codec_head out
    code_predictor: LlamaConfig  # 5-layer Qwen3 decoder, 15 heads over 2048 codes
    text_vocab_size: int
    text_hidden_size: int
    text_act: str
    codec: CodecIds
    text: TextIds
    languages: dict[str, int]  # language name -> codec id ("auto": none)
    speakers: dict[str, int]  # built-in speaker name -> codec id (CustomVoice; empty otherwise)
    dialects: dict[str, str]  # speaker -> the dialect (a language name) it speaks in chinese or auto
    speaker_encoder: SpeakerEncoderConfig | None = None  # Base: the x-vector's encoder

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config.json") -> Qwen3TTSConfig:
        if d.get("model_type") != "qwen3_tts":
            raise CheckpointError(f"{source}: model_type is {d.get('model_type')!r}, not a Qwen3-TTS checkpoint "
                                  f"('qwen3_tts')")
        model_type = d.get("tts_model_type")
        if model_type not in MODEL_TYPES:
            raise CheckpointError(f"{source}: tts_model_type is {model_type!r}; Lyre serves {', '.join(MODEL_TYPES)}")
        talker = _section(d, "talker_config", source)
        predictor = _section(talker, "code_predictor_config", f"{source} talker_config")
        for name, section, want in (("talker_config", talker, None), ("code_predictor_config", predictor, CODES)):
            groups = section.get("num_code_groups")
            if groups != CODE_GROUPS:
                raise CheckpointError(f"{source}: {name}.num_code_groups is {groups!r}; the 12 Hz codec has "
                                      f"{CODE_GROUPS}")
            if want is not None and section.get("vocab_size") != want:
                raise CheckpointError(f"{source}: {name}.vocab_size is {section.get('vocab_size')!r}, not {want}")
        codec = CodecIds(*(_int(talker, f, f"{source} talker_config") for f in CODEC_ID_FIELDS))
        vocab = int(talker.get("vocab_size", 0))
        bad = [f for f, v in zip(CODEC_ID_FIELDS, vars(codec).values(), strict=True) if not CODES <= v < vocab]
        if bad:
            raise CheckpointError(f"{source}: talker_config.{bad[0]} = {talker[bad[0]]} is not a control id "
                                  f"({CODES}..{vocab - 1})")
        text = TextIds(*(_int(d, f, source) for f in TEXT_ID_FIELDS),
                       assistant=int(d.get("assistant_token_id", TextIds.assistant)))
        languages = {k.lower(): int(v) for k, v in (talker.get("codec_language_id") or {}).items()}
        dialects = {k.lower(): str(v).lower() for k, v in (talker.get("spk_is_dialect") or {}).items() if v}
        unknown = next((v for v in dialects.values() if v not in languages), None)
        if unknown is not None:
            raise CheckpointError(f"{source}: talker_config.spk_is_dialect names {unknown!r}, which "
                                  f"codec_language_id does not")
        return cls(
            model_type=model_type,
            model_size=str(d.get("tts_model_size", "")),
            talker=_decoder(talker, f"{source} talker_config"),
            code_predictor=_decoder(predictor, f"{source} code_predictor_config"),
            text_vocab_size=_int(talker, "text_vocab_size", f"{source} talker_config"),
            text_hidden_size=_int(talker, "text_hidden_size", f"{source} talker_config"),
            text_act=str(talker.get("hidden_act", "silu")),
            codec=codec,
            text=text,
            languages=languages,
            speakers={k.lower(): int(v) for k, v in (talker.get("spk_id") or {}).items()},
            dialects=dialects,
            speaker_encoder=_speaker_encoder(d, model_type, int(talker["hidden_size"]), source),
        )

    @property
    def hidden_size(self) -> int:
        return self.talker.hidden_size


def _speaker_encoder(d: dict[str, Any], model_type: str, hidden: int, source: str) -> SpeakerEncoderConfig | None:
    """A Base checkpoint's ``speaker_encoder_config`` (its x-vector is a talker row: enc_dim = hidden)."""
    if model_type != "base":
        return None
    try:
        cfg = SpeakerEncoderConfig.from_dict(d.get("speaker_encoder_config") or {})
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: {e}") from None
    if cfg.enc_dim != hidden:
        raise CheckpointError(f"{source}: speaker_encoder_config.enc_dim is {cfg.enc_dim}; the talker's rows are "
                              f"{hidden} wide")
    return cfg


def _section(d: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    section = d.get(name)
    if not isinstance(section, dict):
        raise CheckpointError(f"{source}: {name} is missing")
    return section


def _int(d: dict[str, Any], name: str, source: str) -> int:
    if not isinstance(d.get(name), int):
        raise CheckpointError(f"{source}: {name} is missing or not an integer")
    return d[name]


def _decoder(d: dict[str, Any], source: str) -> LlamaConfig:
    """A Qwen3 decoder section as the engine's decoder config (q/k norm on, no sliding window)."""
    for name in DECODER_FIELDS:
        _int(d, name, source)
    if d.get("use_sliding_window"):
        raise CheckpointError(f"{source}: use_sliding_window is set; Lyre's Qwen3-TTS talker attends to every position")
    if d["num_attention_heads"] % d["num_key_value_heads"]:
        raise CheckpointError(f"{source}: num_attention_heads is not a multiple of num_key_value_heads")
    scaling = d.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind != "default":  # (M-RoPE with three equal position rows is plain RoPE: research §1)
        raise CheckpointError(f"{source}: rope_scaling type {kind!r} is not supported")
    return LlamaConfig(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"], num_attention_heads=d["num_attention_heads"],
        num_key_value_heads=d["num_key_value_heads"], head_dim=d["head_dim"],
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=float(d.get("rope_theta", 1e6)),
        rope_scaling=None, max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
        tie_word_embeddings=False, torch_dtype=str(d.get("dtype") or d.get("torch_dtype") or "float32"), qk_norm=True,
    )


def read_qwen3tts_config(model_dir: str | Path) -> Qwen3TTSConfig:
    return Qwen3TTSConfig.from_dict(read_config_json(model_dir, "a Qwen3-TTS checkpoint"),
                                    str(Path(model_dir) / "config.json"))
