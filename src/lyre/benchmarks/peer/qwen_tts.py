"""QwenLM's Qwen3-TTS reference implementation (``qwen_tts``, PyPI qwen-tts 0.1.1, installed by
setup.sh without its dependencies) as a peer: importable here with the modules only its 25 Hz
tokenizer needs stubbed (``torchaudio``, ``sox``: imported at import time, never run), and a
checkpoint's model and decoder built from its classes with the checkpoint's weights."""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from pathlib import Path
from typing import Any


def _stub(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = module
    return module


def import_qwen_tts() -> types.ModuleType:
    """``qwen_tts``, with the modules only its 25 Hz tokenizer needs stubbed (after transformers is
    imported: it reads torchaudio's module spec)."""
    if "qwen_tts" not in sys.modules:
        import transformers  # noqa: F401

        if "torchaudio" not in sys.modules:
            audio = _stub("torchaudio")
            audio.compliance = _stub("torchaudio.compliance")
            audio.compliance.kaldi = _stub("torchaudio.compliance.kaldi")
        if "sox" not in sys.modules:
            _stub("sox")
    import qwen_tts

    return qwen_tts


def load_reference(model_dir: Path) -> tuple[Any, Any]:
    """The reference ``Qwen3TTSForConditionalGeneration`` and ``Qwen3TTSTokenizerV2Decoder`` of a
    checkpoint directory (eval mode, CPU, float32), its weights loaded by name."""
    from safetensors.torch import load_file

    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2DecoderConfig,
    )
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder

    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**json.loads((model_dir / "config.json").read_text())))
    missing, unexpected = model.load_state_dict(load_file(str(model_dir / "model.safetensors")), strict=False)
    if unexpected or missing:
        raise RuntimeError(f"{model_dir}'s weights do not fit the reference model ({len(missing)} missing, "
                           f"{len(unexpected)} unexpected)")
    codec = json.loads((model_dir / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    decoder = Qwen3TTSTokenizerV2Decoder(Qwen3TTSTokenizerV2DecoderConfig(**codec))
    weights = load_file(str(model_dir / "speech_tokenizer" / "model.safetensors"))
    decoder.load_state_dict({k.removeprefix("decoder."): v for k, v in weights.items() if k.startswith("decoder.")})
    return model.eval(), decoder.eval()
