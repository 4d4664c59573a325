"""A Qwen3-TTS checkpoint as Lyre finds and loads it: ``lyre checkpoint demo --family qwen3-tts``
writes the real layout (the reference classes load its weights by name), the family and the codec
directory come from the checkpoint itself, ``model.family`` refuses a checkpoint of another family,
and the text tokenizer is built from ``vocab.json`` + ``merges.txt`` as published."""

from __future__ import annotations

import functools
import json
import shutil

import pytest
import torch

from lyre.benchmarks.peer.qwen_tts import load_reference
from lyre.config import load_config
from lyre.family.qwen3tts import demo
from lyre.family.qwen3tts.tokenizer import load_text_tokenizer
from lyre.model import checkpoint
from lyre.model.checkpoint import CheckpointError
from lyre.model.qwen3tts import read_qwen3tts_config
from lyre.tools.checkpoint import main


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return demo.write_demo(tmp_path_factory.mktemp("qwen3") / "demo", seed=0)


def test_the_demo_command_writes_a_checkpoint_the_reference_loads_by_name(tmp_path, capsys):
    assert main(["demo", "--family", "qwen3-tts", str(tmp_path / "q")]) == 0
    assert "serve it with --set model.path=" in capsys.readouterr().out
    assert main(["demo", "--family", "qwen3-tts", str(tmp_path / "q")]) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(["demo", "--family", "qwen3-tts", "--variant", "voice_design", str(tmp_path / "d")]) == 0
    assert read_qwen3tts_config(tmp_path / "d").model_type == "voice_design"
    files = {p.name for p in (tmp_path / "q").iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
            "tokenizer_config.json", "speech_tokenizer"} <= files
    model, decoder = load_reference(tmp_path / "q")  # (every weight by name, or it raises)
    assert model.config.talker_config.spk_id["vivian"] == 3065 and decoder.config.codebook_size == 2048


def test_a_base_demo_carries_the_encoders_cloning_needs_by_the_references_names(tmp_path):
    """``--variant base``: the speaker encoder's weights in model.safetensors and the 12 Hz
    tokenizer's encoder in speech_tokenizer/, each loaded by name by the reference's classes (and by
    Lyre's); the encoder's random codebooks make codes of every kind, not all zeros."""
    import numpy as np
    from safetensors.torch import load_file

    from lyre.codec.qwen12hz.encoder import load_reference_encoder
    from tests.support.qwen_reference import import_qwen_tts

    assert main(["demo", "--family", "qwen3-tts", "--variant", "base", str(tmp_path / "b")]) == 0
    model, _ = load_reference(tmp_path / "b")  # (every weight by name, the speaker encoder's included)
    assert model.speaker_encoder is not None and not read_qwen3tts_config(tmp_path / "b").speakers
    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    speech = tmp_path / "b" / "speech_tokenizer"
    tokenizer = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**json.loads((speech / "config.json").read_text())))
    tokenizer.load_state_dict(load_file(str(speech / "model.safetensors")), strict=True)
    codes = load_reference_encoder(speech).encode(np.sin(np.arange(24000) / 9).astype(np.float32) * 0.3)
    assert codes.shape == (13, 16) and len(np.unique(codes)) > 16


def test_the_family_and_the_codec_come_from_the_checkpoint(written, demo_dir):
    cfg = load_config(None, {"model.path": str(written)})
    resolved = checkpoint.resolve_model(cfg.model, cfg.codec)
    assert resolved.family == "qwen3-tts" and resolved.snac_dir == written / "speech_tokenizer"
    assert resolved.is_demo  # (its marker says so: the banner is shown)
    assert read_qwen3tts_config(written).speakers["vivian"] == 3065
    wrong = load_config(None, {"model.path": str(written), "model.family": "orpheus"})
    with pytest.raises(CheckpointError, match="model.family is orpheus, but the checkpoint at .* is qwen3-tts"):
        checkpoint.resolve_model(wrong.model, wrong.codec)
    orpheus = load_config(None, {"model.path": str(demo_dir / "llama"), "model.family": "qwen3-tts"})
    with pytest.raises(CheckpointError, match="is orpheus"):
        checkpoint.resolve_model(orpheus.model, orpheus.codec)


def test_a_checkpoint_of_another_model_type_is_not_guessed(written, tmp_path):
    other = shutil.copytree(written, tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "bark"}))
    cfg = load_config(None, {"model.path": str(other)})
    with pytest.raises(CheckpointError, match="model_type 'bark' is not a model family Lyre serves"):
        checkpoint.resolve_model(cfg.model, cfg.codec)


def test_the_text_tokenizer_reads_the_published_files(written, tmp_path):
    tok = load_text_tokenizer(written)
    assert tok.encode("<|im_start|>assistant\n").ids[0] == 151644
    assert tok.token_to_id("<tts_pad>") == 151671 and tok.token_to_id("<tts_text_eod>") == 151673
    assert tok.decode(tok.encode("Your balance is 42 dollars.").ids) == "Your balance is 42 dollars."
    assert all(i < 151643 for i in tok.encode("plain text, digits 12345").ids)
    broken = shutil.copytree(written, tmp_path / "broken", ignore=shutil.ignore_patterns("speech_tokenizer"))
    (broken / "merges.txt").unlink()
    with pytest.raises(CheckpointError, match="merges.txt missing"):
        load_text_tokenizer(broken)
    (broken / "merges.txt").write_text("a b c\n")
    with pytest.raises(CheckpointError, match="'a b c' is not a merge"):
        load_text_tokenizer(broken)


def test_the_demo_is_the_same_on_every_run(written, tmp_path):
    again = demo.write_demo(tmp_path / "again", seed=0)
    for name in ("model.safetensors", "vocab.json", "merges.txt", "speech_tokenizer/model.safetensors"):
        assert (again / name).read_bytes() == (written / name).read_bytes(), name
    assert not torch.equal(demo.random_weights(1)["talker.codec_head.weight"],
                           demo.random_weights(0)["talker.codec_head.weight"])


def test_a_qwen3_tts_repository_downloads_with_its_codec_and_nothing_else_then_serves(written, tmp_path, capsys,
                                                                                       monkeypatch):
    from tests.support.fake_hub import FakeHub

    decoys = {"README.md": b"# model", "speech_tokenizer/README.md": b"x", "training/optimizer.pt": b"o",
              "speech_tokenizer/old/model.safetensors": b"s", "assets/demo.wav": b"w"}
    files = FakeHub.files_of(written, **decoys)
    cache = tmp_path / "hf-cache"
    with FakeHub({"Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice": files}) as hub:
        # (the command's download, pointed at the fake hub and a fresh cache)
        monkeypatch.setattr(checkpoint, "download", functools.partial(checkpoint.download, cache_dir=cache,
                                                                      endpoint=hub.endpoint))
        assert main(["download", "--family", "qwen3-tts", "--model-id", "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"]) == 0
        fetched = hub.fetched("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    wanted = {f for f in files if f not in decoys and f not in ("README.md", demo.MARKER)}
    assert fetched == wanted  # the model, its tokenizer files and speech_tokenizer/: nothing else
    assert "speech_tokenizer" in capsys.readouterr().out
    # once in the cache, the id resolves to it (family auto: read from its config.json), codec inside
    cfg = load_config(None, {"model.hf_id": "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"})
    resolved = checkpoint.resolve_model(cfg.model, cfg.codec, cache_dir=cache)
    assert resolved.family == "qwen3-tts" and resolved.snac_dir == resolved.llama_dir / "speech_tokenizer"
    assert not resolved.is_demo and "Hugging Face cache" in resolved.source
    load_text_tokenizer(resolved.llama_dir)


def test_the_text_tokenizer_reads_text_as_transformers_qwen2_tokenizer_does(written):
    """The tokenizer Lyre builds from the published files against the one the reference uses
    (transformers' Qwen2 tokenizer, from the same files)."""
    from transformers import AutoTokenizer

    reference, ours = AutoTokenizer.from_pretrained(str(written)), load_text_tokenizer(written)
    assert type(reference).__name__ == "Qwen2TokenizerFast"
    for text in ["Hello world, thanks for calling!", "Your balance is $1,234.50 as of 03/04/2027.",
                 "  leading spaces\nand\n\nnewlines  ", "Café naïve — “quotes” 中文 日本語", "don't won't I'll",
                 "<|im_start|>assistant\nHi<|im_end|>\n", "numbers 12345 and 3.14", "tabs\tand\r\nreturns"]:
        assert ours.encode(text).ids == reference(text, add_special_tokens=False)["input_ids"], text
