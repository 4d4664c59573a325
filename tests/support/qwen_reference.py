"""The Qwen3-TTS reference implementation, QwenLM's ``qwen_tts`` (PyPI qwen-tts 0.1.1, installed by
setup.sh without its dependencies), importable in the test environment, and tiny random models
built from its own classes (no download: the constructors take configs only), so that Lyre's
Qwen3-TTS code can be judged against the reference token for token (issue 31).

``import_qwen_tts`` (the benchmark's peer module) stubs the modules only its 25 Hz tokenizer needs.
The tiny configs follow the real checkpoints'
layout (``../shared/research/qwen3-tts.md`` §1, §10): the real codec special ids, languages and
speaker ids (the class defaults are wrong), 16 code groups, a 3072-id codec vocabulary whose last
1024 ids the reference suppresses, M-RoPE sections summing to half the head dim.
"""

from __future__ import annotations

from typing import Any

import torch

from lyre.benchmarks.peer.qwen_tts import import_qwen_tts

# the real checkpoints' control ids (config.json; the classes' defaults are outside the vocabulary)
CODEC_IDS = {"codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_think_id": 2154,
             "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157}
LANGUAGES = {"english": 2050, "german": 2053, "chinese": 2055, "sichuan_dialect": 2062}
SPEAKERS = {"vivian": 3065, "ryan": 3061, "eric": 2875}  # eric: a dialect speaker
DIALECT = {"vivian": False, "ryan": False, "eric": "sichuan_dialect"}
TEXT_VOCAB = 151936
IM_START, IM_END, ASSISTANT, NEWLINE = 151644, 151645, 77091, 198


def tiny_config(model_type: str = "custom_voice", hidden: int = 64, layers: int = 2) -> Any:
    """A ``Qwen3TTSConfig`` of the real layout at a tiny size (talker ``hidden``, 4 heads of 16)."""
    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig

    code_predictor = dict(vocab_size=2048, hidden_size=48, intermediate_size=96, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=12, rope_theta=1e6,
                          num_code_groups=16)
    custom = model_type == "custom_voice"
    talker = dict(code_predictor_config=code_predictor, vocab_size=3072, hidden_size=hidden,
                  intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, rope_theta=1e6,
                  rope_scaling={"mrope_section": [4, 2, 2], "interleaved": True, "rope_type": "default"},
                  num_code_groups=16, text_hidden_size=32, text_vocab_size=TEXT_VOCAB, **CODEC_IDS,
                  spk_id=dict(SPEAKERS) if custom else {}, spk_is_dialect=dict(DIALECT) if custom else {},
                  codec_language_id=dict(LANGUAGES))
    speaker_encoder = dict(enc_dim=hidden, enc_channels=[16, 16, 16, 16, 48], enc_attention_channels=8,
                           enc_se_channels=8)
    return Qwen3TTSConfig(talker_config=talker, speaker_encoder_config=speaker_encoder, tts_model_type=model_type,
                          tts_model_size="0b6")


def tiny_model(model_type: str = "custom_voice", seed: int = 0) -> Any:
    """A seeded random ``Qwen3TTSForConditionalGeneration`` of :func:`tiny_config` (eval mode, CPU)."""
    config = tiny_config(model_type)
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration

    torch.manual_seed(seed)
    return Qwen3TTSForConditionalGeneration(config).eval()


def loud_text(model: Any) -> Any:
    """``model`` with its text embedding scaled up: the text's rows large enough that another text
    is other audio from the first frame (random weights otherwise let the codec rows drown it)."""
    with torch.no_grad():
        model.talker.model.text_embedding.weight.mul_(50)
    return model


def target_ids(text_ids: list[int]) -> torch.Tensor:
    """The reference's target template ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``
    around already-tokenized text, as a (1, n) batch."""
    return torch.tensor([[IM_START, ASSISTANT, NEWLINE, *text_ids, IM_END, NEWLINE, IM_START, ASSISTANT, NEWLINE]])


def reference_codes(model: Any, text_ids: list[list[int]], speaker: str | None = "vivian", language: str = "english",
                    max_frames: int = 12, **sampling: Any) -> list[torch.Tensor]:
    """The reference's frames for each text: a (frames, 16) tensor of codes per text (greedy at both
    levels, no penalty, unless ``sampling`` says otherwise)."""
    options = dict(do_sample=False, subtalker_dosample=False, repetition_penalty=1.0, **sampling)
    codes, _ = model.generate(input_ids=[target_ids(t) for t in text_ids], languages=[language] * len(text_ids),
                              speakers=[speaker] * len(text_ids) if speaker else None, non_streaming_mode=False,
                              max_new_tokens=max_frames + 1, **options)
    return codes


def tiny_decoder_config(window: int = 8) -> dict[str, Any]:
    """The 12 Hz decoder's ``decoder_config`` at a tiny width, with the real upsampling (1920 samples
    per frame) and a short sliding ``window`` (so short tests cross it)."""
    return dict(codebook_size=64, codebook_dim=32, latent_dim=32, hidden_size=32, intermediate_size=64,
                num_attention_heads=4, num_key_value_heads=4, head_dim=16, num_hidden_layers=2, sliding_window=window,
                num_quantizers=16, upsampling_ratios=[2, 2], upsample_rates=[8, 5, 4, 3], decoder_dim=64)


def tiny_decoder(seed: int = 0, window: int = 8) -> Any:
    """QwenLM's ``Qwen3TTSTokenizerV2Decoder`` at :func:`tiny_decoder_config`, every parameter drawn at
    random (seeded; the codebooks' use counts positive), in eval mode. The convolutions' draws are
    small enough that the audio stays inside [-1, 1] (larger ones clamp nearly every sample, hiding
    differences); the transformer's are large enough that a wrong attention window changes the audio."""
    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2DecoderConfig,
    )
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder

    decoder = Qwen3TTSTokenizerV2Decoder(Qwen3TTSTokenizerV2DecoderConfig(**tiny_decoder_config(window))).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in decoder.named_parameters():
            # the transformer's larger, or its attention window would hardly show in the audio
            value = torch.randn(p.shape, generator=g) * (0.3 if name.startswith("pre_transformer") else 0.05)
            p.copy_(value.abs() + 0.5 if name.endswith("cluster_usage") else value)
    return decoder


# a Mimi encoder (the 12 Hz tokenizer's) at a tiny width: the real 1920-sample frame, 2048 codes
TINY_MIMI = dict(hidden_size=32, num_filters=4, num_residual_layers=1, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=16, intermediate_size=64, codebook_size=2048, codebook_dim=16,
                 vector_quantization_hidden_dimension=16, num_quantizers=32, upsample_groups=32, sliding_window=250)


def tiny_tokenizer(seed: int = 0) -> Any:
    """QwenLM's ``Qwen3TTSTokenizerV2Model`` (encoder and decoder) at tiny widths, its encoder's
    parameters and codebooks drawn at random (seeded; Mimi's codebooks start at zero, which would
    make every code 0)."""
    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    model = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(
        encoder_config=TINY_MIMI, decoder_config=tiny_decoder_config(), encoder_valid_num_quantizers=16)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in [*model.encoder.named_parameters(), *model.encoder.named_buffers()]:
            if t.is_floating_point():
                value = torch.randn(t.shape, generator=g) * 0.1
                t.copy_(value.abs() + 0.5 if name.endswith(("cluster_usage", "initialized")) else value)
    return model
