"""A Qwen3-TTS checkpoint's config.json as Lyre reads it: the real file (written by the reference's
``save_pretrained``) gives the talker's and code predictor's shapes and the control ids; a file
that is not one, or whose ids or code groups would make wrong audio, is refused naming the field."""

from __future__ import annotations

import copy
import json

import pytest

from lyre.errors import CheckpointError
from lyre.model.qwen3tts import Qwen3TTSConfig, read_qwen3tts_config
from tests.support.qwen_reference import tiny_model


@pytest.fixture(scope="module")
def config_json(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("qwen3-config")
    tiny_model("custom_voice").save_pretrained(path)
    return json.loads((path / "config.json").read_text())


def test_the_references_config_reads_as_the_checkpoint_says(config_json, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    cfg = read_qwen3tts_config(tmp_path)
    assert (cfg.model_type, cfg.talker.vocab_size, cfg.code_predictor.vocab_size) == ("custom_voice", 3072, 2048)
    assert cfg.talker.qk_norm and cfg.talker.head_dim == 16 and cfg.code_predictor.hidden_size == 48
    assert (cfg.codec.eos, cfg.codec.bos, cfg.text.tts_pad) == (2150, 2149, 151671)
    assert cfg.speakers["vivian"] == 3065 and cfg.dialects == {"eric": "sichuan_dialect"}


def broken(config: dict, path: str, value) -> dict:
    out = copy.deepcopy(config)
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return out


@pytest.mark.parametrize(("path", "value", "named"), [
    ("model_type", "llama", "model_type"),
    ("tts_model_type", "music", "tts_model_type"),
    ("talker_config", KeyError, "talker_config"),
    ("talker_config.num_code_groups", 32, "num_code_groups"),
    ("talker_config.code_predictor_config.vocab_size", 4096, "vocab_size"),
    ("talker_config.codec_eos_token_id", 4198, "codec_eos_token_id"),  # the reference class's default
    ("talker_config.text_vocab_size", KeyError, "text_vocab_size"),
    ("talker_config.head_dim", KeyError, "head_dim"),
    ("talker_config.spk_is_dialect", {"eric": "klingon_dialect"}, "spk_is_dialect"),
    ("talker_config.use_sliding_window", True, "use_sliding_window"),
    ("tts_pad_token_id", KeyError, "tts_pad_token_id"),
])
def test_a_config_that_would_make_wrong_audio_is_refused_naming_the_field(config_json, path, value, named):
    with pytest.raises(CheckpointError, match=named):
        Qwen3TTSConfig.from_dict(broken(config_json, path, value))


def test_a_directory_without_a_config_is_not_a_qwen3_tts_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a Qwen3-TTS checkpoint: config.json is missing"):
        read_qwen3tts_config(tmp_path)
