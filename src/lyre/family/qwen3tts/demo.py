"""The Qwen3-TTS demo checkpoint: a seeded random CustomVoice model at a tiny size, in the file
layout of the real downloads (``config.json``, ``generation_config.json``, ``model.safetensors``
with the reference's weight names, ``vocab.json`` + ``merges.txt`` + ``tokenizer_config.json``,
``speech_tokenizer/`` with its config and decoder weights), so that the loading code is the one
real checkpoints use. The real control ids, languages and speakers; random weights: NOISE.
``lyre checkpoint demo --family qwen3-tts DIR`` writes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from lyre.codec.qwen12hz import Decoder, DecoderConfig
from lyre.codec.qwen12hz.encoder import mimi_encoder
from lyre.family.qwen3tts.tokenizer import SPLIT_PATTERN, byte_level_bpe
from lyre.model.demo import MARKER, RANDOM_WEIGHTS, replaced_directory
from lyre.model.demo_tokenizer import CORPUS
from lyre.model.qwen3tts import CODE_GROUPS, CODES
from lyre.model.qwen3tts.speaker import SpeakerEncoder, SpeakerEncoderConfig

DEMO_FORMAT = 2
TEXT_VOCAB = 151936
# the released checkpoints' ids (config.json; research §1)
CODEC_IDS = {"codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_think_id": 2154,
             "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157}
LANGUAGES = {"english": 2050, "german": 2053, "spanish": 2054, "chinese": 2055, "japanese": 2058, "french": 2061,
             "sichuan_dialect": 2062, "korean": 2064, "russian": 2069, "italian": 2070, "portuguese": 2071,
             "beijing_dialect": 2074}
SPEAKERS = {"aiden": 2861, "sohee": 2864, "ono_anna": 2873, "eric": 2875, "dylan": 2878, "uncle_fu": 3010,
            "ryan": 3061, "vivian": 3065, "serena": 3066}
DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
SPECIAL_TOKENS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>",
                  151671: "<tts_pad>", 151672: "<tts_text_bos>", 151673: "<tts_text_eod>"}
TALKER = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32)
CODE_PREDICTOR = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16)
TEXT_HIDDEN = 32
# shape -> (talker, code predictor, text hidden). tiny: a step costs almost nothing (tests, quick start);
# small: the real code predictor's depth and head layout at half the width, a third of the talker's
# layers at half its width: the 15-pass loop's cost against the talker's, in proportion, on a CPU
SHAPES = {
    "tiny": (TALKER, CODE_PREDICTOR, TEXT_HIDDEN),
    "small": (dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64),
              dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=5, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64), 64),
    # Qwen3-TTS-1.7B's (research/qwen3-tts.md section 1): for shape checkpoints (write_shape_checkpoint), whose
    # weights are made where they are loaded (written to disk it takes 7.7 GB)
    "1.7b": (dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128),
             dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128), 2048),
}
DECODER = dict(codebook_size=CODES, codebook_dim=32, latent_dim=32, hidden_size=32, intermediate_size=64,
               num_attention_heads=4, num_key_value_heads=4, head_dim=16, num_hidden_layers=2, sliding_window=72,
               num_quantizers=CODE_GROUPS, upsampling_ratios=[2, 2], upsample_rates=[8, 5, 4, 3], decoder_dim=64)
# the released 12 Hz tokenizer's decoder (research/qwen3-tts.md section 6: 114M parameters): the 1.7b shape's
REAL_DECODER = dict(codebook_size=CODES, codebook_dim=512, latent_dim=1024, hidden_size=512, intermediate_size=1024,
                    num_attention_heads=16, num_key_value_heads=16, head_dim=64, num_hidden_layers=8, sliding_window=72,
                    num_quantizers=CODE_GROUPS, upsampling_ratios=[2, 2], upsample_rates=[8, 5, 4, 3],
                    decoder_dim=1536)
DECODERS = {"tiny": DECODER, "small": DECODER, "1.7b": REAL_DECODER}
GENERATION = {"do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
              "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
              "subtalker_temperature": 0.9, "max_new_tokens": 8192}

_README = """\
# Lyre Qwen3-TTS demo checkpoint — NOT A REAL MODEL

Written by `lyre checkpoint demo --family qwen3-tts`. The weights are seeded random numbers:
everything it "says" is noise. It has the layout, control ids, languages and speakers of
Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice (or the -VoiceDesign or -Base layout it was written as), so
Lyre serves it as it would the real model.
"""


VARIANTS = {"custom_voice": "0b6", "voice_design": "1b7", "base": "0b6"}  # model types written, the size each says
# Base: the speaker encoder at a tiny width (the real one: channels 512 x 4 + 1536, attention and SE 128)
SPEAKER_ENCODER = dict(enc_channels=[16, 16, 16, 16, 48], enc_attention_channels=8, enc_se_channels=8)
# Base: the 12 Hz tokenizer's encoder (Mimi) at a tiny width: the real 1920-sample frame, 2048 codes
MIMI = dict(hidden_size=32, num_filters=4, num_residual_layers=1, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, head_dim=16, intermediate_size=64, codebook_size=CODES, codebook_dim=16,
            vector_quantization_hidden_dimension=16, num_quantizers=32, upsample_groups=32, sliding_window=250)


def demo_config(shape: str = "tiny", variant: str = "custom_voice") -> dict[str, Any]:
    """config.json as the reference's ``save_pretrained`` writes it, in ``shape`` (:data:`SHAPES`),
    a CustomVoice checkpoint (0.6B's speakers), a VoiceDesign one (1.7B's: no speakers) or a Base
    one (no speakers; a speaker encoder)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown Qwen3-TTS demo variant {variant!r}: one of {', '.join(VARIANTS)}")
    speakers = SPEAKERS if variant == "custom_voice" else {}
    talker_shape, cp_shape, text_hidden = _shape(shape)
    decoder = lambda d: dict(d, rms_norm_eps=1e-6, rope_theta=1e6, hidden_act="silu",  # noqa: E731
                             max_position_embeddings=32768, attention_bias=False, use_sliding_window=False)
    half = talker_shape["head_dim"] // 2
    talker = dict(decoder(talker_shape), vocab_size=3072, num_code_groups=CODE_GROUPS, text_hidden_size=text_hidden,
                  text_vocab_size=TEXT_VOCAB, model_type="qwen3_tts_talker",
                  rope_scaling={"mrope_section": [half // 2, half // 4, half - half // 2 - half // 4],
                                "interleaved": True, "rope_type": "default"},
                  code_predictor_config=dict(decoder(cp_shape), vocab_size=CODES, num_code_groups=CODE_GROUPS),
                  spk_id=speakers, spk_is_dialect={s: DIALECTS.get(s, False) for s in speakers},
                  codec_language_id=LANGUAGES, **CODEC_IDS)
    config = {"architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
              "tts_model_type": variant, "tts_model_size": VARIANTS[variant], "assistant_token_id": 77091,
              "im_start_token_id": 151644, "im_end_token_id": 151645, "tts_pad_token_id": 151671,
              "tts_bos_token_id": 151672, "tts_eos_token_id": 151673, "talker_config": talker, "dtype": "float32"}
    if variant == "base":
        config["speaker_encoder_config"] = dict(SPEAKER_ENCODER, enc_dim=talker_shape["hidden_size"])
    return config


def _decoder_weights(d: dict[str, int], prefix: str) -> dict[str, tuple[int, ...]]:
    h, hd, i = d["hidden_size"], d["head_dim"], d["intermediate_size"]
    heads, kv = d["num_attention_heads"], d["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {f"{prefix}norm.weight": (h,)}
    for n in range(d["num_hidden_layers"]):
        p = f"{prefix}layers.{n}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
                   p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd),
                   p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                   p + "mlp.down_proj.weight": (h, i)}
    return shapes


def _shape(shape: str) -> tuple[dict[str, int], dict[str, int], int]:
    if shape not in SHAPES:
        raise ValueError(f"unknown Qwen3-TTS demo shape {shape!r}: one of {', '.join(SHAPES)}")
    return SHAPES[shape]


def weight_shapes(shape: str = "tiny", variant: str = "custom_voice") -> dict[str, tuple[int, ...]]:
    """Every tensor of the demo's model.safetensors in ``shape``, by the reference's names."""
    talker, predictor, text_hidden = _shape(shape)
    h, cp = talker["hidden_size"], predictor["hidden_size"]
    shapes = _decoder_weights(talker, "talker.model.") | _decoder_weights(predictor, "talker.code_predictor.model.")
    shapes |= {"talker.model.codec_embedding.weight": (3072, h), "talker.codec_head.weight": (3072, h),
               "talker.model.text_embedding.weight": (TEXT_VOCAB, text_hidden),
               "talker.text_projection.linear_fc1.weight": (text_hidden, text_hidden),
               "talker.text_projection.linear_fc1.bias": (text_hidden,),
               "talker.text_projection.linear_fc2.weight": (h, text_hidden),
               "talker.text_projection.linear_fc2.bias": (h,)}
    if cp != h:  # (the reference's projection is an identity where the widths agree: no weights)
        shapes |= {"talker.code_predictor.small_to_mtp_projection.weight": (cp, h),
                   "talker.code_predictor.small_to_mtp_projection.bias": (cp,)}
    for j in range(CODE_GROUPS - 1):
        shapes[f"talker.code_predictor.model.codec_embedding.{j}.weight"] = (CODES, h)
        shapes[f"talker.code_predictor.lm_head.{j}.weight"] = (CODES, cp)
    if variant == "base":
        encoder = SpeakerEncoder(SpeakerEncoderConfig.from_dict(dict(SPEAKER_ENCODER, enc_dim=h)))
        shapes |= {f"speaker_encoder.{k}": tuple(v.shape) for k, v in encoder.state_dict().items()}
    return shapes


def random_weights(seed: int, shape: str = "tiny", variant: str = "custom_voice", device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Seeded random weights: norms at one, biases at zero, the rest N(0, 0.02) as the reference initialises;
    made on ``device`` (a shape checkpoint's on the GPU that loads it)."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, size in sorted(weight_shapes(shape, variant).items()):
        if name.endswith("norm.weight"):
            out[name] = torch.ones(size, device=device, dtype=dtype)
        elif name.endswith(".bias"):
            out[name] = torch.zeros(size, device=device, dtype=dtype)
        else:
            out[name] = (torch.randn(size, generator=g, device=device) * 0.02).to(dtype)
    return out


def random_decoder_weights(decoder: Any, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random weights for the 12 Hz decoder ``decoder`` (on its device), small enough in its
    convolutions that the audio is not clamped (named as its state dict)."""
    device = next(decoder.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed + 1)
    out = {}
    for name, p in decoder.state_dict().items():
        value = torch.randn(p.shape, generator=g, device=device) * (0.3 if name.startswith("pre_transformer") else 0.05)
        out[name] = (value.abs() + 0.5 if name.endswith("cluster_usage") else value).to(p.dtype)
    return out


def write_shape_checkpoint(out_dir: Path, shape: str = "1.7b", variant: str = "custom_voice", seed: int = 0) -> Path:
    """A demo checkpoint in ``shape`` without weights: its config, tokenizer and speech tokenizer config,
    and ``random-weights.json`` in it and in ``speech_tokenizer/``, so that loading it makes seeded
    random weights on the loading device (nothing large on disk; NOISE, and its marker says demo)."""
    config = demo_config(shape, variant)
    with replaced_directory(out_dir) as tmp:
        _json(tmp / "config.json", config)
        _json(tmp / "generation_config.json", GENERATION)
        _json(tmp / RANDOM_WEIGHTS, {"seed": seed, "shape": shape, "variant": variant})
        _write_tokenizer(tmp)
        (tmp / "speech_tokenizer").mkdir()
        _json(tmp / "speech_tokenizer" / "config.json", _speech_config(DECODERS[shape]))
        _json(tmp / "speech_tokenizer" / RANDOM_WEIGHTS, {"seed": seed})
        (tmp / "README.md").write_text(_README)
        _json(tmp / MARKER, {"format": DEMO_FORMAT, "seed": seed, "family": "qwen3-tts", "shape": shape,
                             "variant": variant, "weights": "random, made where loaded"})
    return Path(out_dir)


def random_marker(directory: Path) -> dict[str, Any] | None:
    """A shape checkpoint's ``random-weights.json`` in ``directory`` (None: real weights there)."""
    try:
        return json.loads((Path(directory) / RANDOM_WEIGHTS).read_text())
    except (OSError, ValueError):
        return None


def demo_tokenizer() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The vocabulary and merges of a byte-level BPE trained on a few call-centre lines (Qwen's
    pre-tokenizer; "assistant" and "user" single tokens, as in Qwen's vocabulary)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=1024, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    trainer_tok.train_from_iterator([*CORPUS, *["assistant\nuser\n"] * 50], trainer)
    model = json.loads(trainer_tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges


def write_demo(out_dir: Path, seed: int = 0, shape: str = "tiny", variant: str = "custom_voice") -> Path:
    """Write the demo checkpoint in ``shape`` (a ``variant``: CustomVoice or VoiceDesign) to
    ``out_dir``, replacing it atomically."""
    config = demo_config(shape, variant)
    with replaced_directory(out_dir) as tmp:
        _json(tmp / "config.json", config)
        _json(tmp / "generation_config.json", GENERATION)
        save_file(random_weights(seed, shape, variant), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        _write_tokenizer(tmp)
        write_speech_tokenizer(tmp / "speech_tokenizer", seed, encoder=variant == "base")
        (tmp / "README.md").write_text(_README)
        _json(tmp / MARKER, {"format": DEMO_FORMAT, "seed": seed, "family": "qwen3-tts", "shape": shape,
                             "variant": variant})
    return Path(out_dir)


def _write_tokenizer(out_dir: Path) -> None:
    """vocab.json, merges.txt and tokenizer_config.json of the demo's text tokenizer."""
    vocab, merges = demo_tokenizer()
    vocab = dict(vocab) | {text: i for i, text in SPECIAL_TOKENS.items()}
    byte_level_bpe(vocab, merges, SPECIAL_TOKENS)  # (it builds: the files say what they should)
    _json(out_dir / "vocab.json", vocab)
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    _json(out_dir / "tokenizer_config.json", {
        "added_tokens_decoder": {str(i): {"content": t, "special": True} for i, t in SPECIAL_TOKENS.items()},
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768})


def _speech_config(decoder: dict[str, Any]) -> dict[str, Any]:
    return {"model_type": "qwen3_tts_tokenizer_12hz", "decoder_config": decoder, "decode_upsample_rate": 1920,
            "output_sample_rate": 24000}


def write_speech_tokenizer(out_dir: Path, seed: int, encoder: bool = False) -> Path:
    """``speech_tokenizer/``: the 12 Hz tokenizer's config and its decoder's weights (seeded random,
    the convolutions' small enough that the audio is not clamped); with ``encoder`` (Base), its
    encoder's too (random codebooks: Mimi's start at zero, which would make every code 0)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config = _speech_config(DECODER)
    decoder = Decoder(DecoderConfig.from_dict(DECODER))
    g = torch.Generator().manual_seed(seed + 1)
    weights = {}
    for name, p in decoder.state_dict().items():
        value = torch.randn(p.shape, generator=g) * (0.3 if name.startswith("pre_transformer") else 0.05)
        weights["decoder." + name] = value.abs() + 0.5 if name.endswith("cluster_usage") else value
    if encoder:  # (its values drawn after the decoder's, from the same generator)
        config |= {"encoder_config": MIMI, "encoder_valid_num_quantizers": CODE_GROUPS,
                   "encode_downsample_rate": 1920, "input_sample_rate": 24000}
        for name, t in mimi_encoder(MIMI).state_dict().items():
            if t.is_floating_point():
                value = torch.randn(t.shape, generator=g) * 0.1
                t = value.abs() + 0.5 if name.endswith(("cluster_usage", "initialized")) else value
            weights["encoder." + name] = t
    _json(out_dir / "config.json", config)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def demo_is_current(out_dir: Path, seed: int = 0, shape: str = "tiny", variant: str = "custom_voice") -> bool:
    try:
        marker = json.loads((Path(out_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (marker.get("format"), marker.get("seed"), marker.get("family"), marker.get("shape"),
            marker.get("variant")) == (DEMO_FORMAT, seed, "qwen3-tts", shape, variant)


def ensure_demo(out_dir: Path, seed: int = 0, shape: str = "tiny") -> Path:
    """The demo at ``out_dir``, written first unless an up-to-date one of this seed and shape is there."""
    if not demo_is_current(out_dir, seed, shape):
        write_demo(out_dir, seed, shape)
    return Path(out_dir)


def is_demo(model_dir: Path) -> bool:
    """Whether ``model_dir`` is a Qwen3-TTS demo checkpoint."""
    try:
        return json.loads((Path(model_dir) / MARKER).read_text()).get("family") == "qwen3-tts"
    except (OSError, ValueError):
        return False


def _json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
