"""lyre.model.checkpoint and lyre.model.demo: loading as published, the demo checkpoint, hub cache and download."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from lyre.config import load_config
from lyre.model import checkpoint, demo, orpheus
from lyre.model.checkpoint import CheckpointError
from lyre.model.checkpoint.llama import load_llama_weights, read_llama_config
from tests.support.paths import REPO_ROOT

SMALL_UNTIED = {
    **demo.DEMO_LLAMA_CONFIG,
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "tie_word_embeddings": False,
    "rope_scaling": None,
    "torch_dtype": "float32",
}


# --- the demo checkpoint ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def written_demo(tmp_path_factory) -> Path:
    """A demo checkpoint written afresh by this run (once for the module: writing one takes seconds)."""
    return demo.write_demo(tmp_path_factory.mktemp("written") / "demo")


def test_demo_is_byte_identical_on_every_run(demo_dir, written_demo):
    first = json.loads((demo_dir / demo.MARKER).read_text())["files"]
    second = demo._digest(written_demo)
    assert second == first
    assert demo._digest(demo_dir) == first  # nobody changed the repository's copy either
    assert set(first) >= {"llama/config.json", "llama/model.safetensors", "llama/tokenizer.json",
                          "snac/config.json", "snac/pytorch_model.bin"}


def test_demo_llama_has_orpheus_layout_and_loads_through_the_real_path(demo_dir):
    cfg = checkpoint.read_llama_config(demo_dir / "llama")
    assert cfg.vocab_size == orpheus.VOCAB_SIZE and cfg.tie_word_embeddings
    assert cfg.rope_scaling["rope_type"] == "llama3" and cfg.rope_theta == 500000.0
    assert cfg.num_attention_heads // cfg.num_key_value_heads == 3
    weights = checkpoint.load_llama_weights(demo_dir / "llama", dtype=torch.float32)
    assert weights["model.embed_tokens.weight"].dtype == torch.float32
    assert "lm_head.weight" not in weights
    total = sum(t.numel() for t in weights.values())
    assert total < 40_000_000  # small enough for a fast CPU test suite


def test_transformers_loads_the_demo_as_a_llama(demo_dir):
    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM.from_pretrained(demo_dir / "llama", dtype=torch.float32)
    ours = checkpoint.load_llama_weights(demo_dir / "llama", dtype=torch.float32)
    theirs = model.state_dict()
    for name, t in ours.items():
        assert torch.equal(theirs[name], t), name
    assert torch.equal(theirs["lm_head.weight"], ours["model.embed_tokens.weight"])  # tied


def test_demo_tokenizer_puts_special_tokens_at_orpheus_ids(demo_tokenizer):
    tok = demo_tokenizer
    assert tok.get_vocab_size() == orpheus.VOCAB_SIZE
    assert tok.token_to_id("<|begin_of_text|>") == orpheus.BOS
    assert tok.token_to_id("<|eot_id|>") == orpheus.END_OF_TEXT
    assert tok.token_to_id("<custom_token_10>") == orpheus.AUDIO_TOKEN_OFFSET
    assert tok.token_to_id("<custom_token_2>") == orpheus.END_OF_SPEECH
    assert tok.id_to_token(orpheus.VOCAB_SIZE - 1) == "<custom_token_28683>"
    assert tok.encode("Hello world").ids[0] == orpheus.BOS
    assert tok.decode(tok.encode("Hello <laugh> world").ids) == "Hello <laugh> world"


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=80) | st.sampled_from(orpheus.EMOTION_TAGS).map(lambda t: f"ok {t} then"))
def test_demo_tokenizer_text_ids_stay_below_128000(demo_tokenizer, text):
    # (text that spells a special token, e.g. "<|eot_id|>", encodes to it: build_prompt_ids refuses such text)
    assume(demo_tokenizer.token_to_id(text) is None or demo_tokenizer.token_to_id(text) < orpheus.TEXT_VOCAB_END)
    assume("<|" not in text and "<custom_token_" not in text)
    ids = demo_tokenizer.encode(text, add_special_tokens=False).ids
    assert all(i < orpheus.TEXT_VOCAB_END for i in ids)
    assert demo_tokenizer.decode(ids) == text


def test_ensure_demo_rewrites_an_incomplete_demo_only(written_demo, tmp_path):
    target = shutil.copytree(written_demo, tmp_path / "demo")
    demo.ensure_demo(target)
    marker_time = (target / demo.MARKER).stat().st_mtime_ns
    demo.ensure_demo(target)
    assert (target / demo.MARKER).stat().st_mtime_ns == marker_time  # up to date: untouched
    (target / "snac" / "pytorch_model.bin").unlink()
    assert not demo.demo_is_current(target)
    demo.ensure_demo(target)
    assert (target / "snac" / "pytorch_model.bin").is_file()


def test_demo_command_line(written_demo, tmp_path, capsys):
    from lyre.tools.checkpoint import main

    assert main(["demo", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "wrote the demo checkpoint" in out and "noise" in out and demo.demo_is_current(tmp_path / "d")
    assert main(["demo", str(shutil.copytree(written_demo, tmp_path / "copy"))]) == 0
    assert "up to date" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["demo"])
    assert refused.value.code == 2 and "the following arguments are required: dir" in capsys.readouterr().err


def test_a_demo_of_another_shape_is_written_and_served_by_model_path(written_demo, tmp_path, capsys):
    """``lyre checkpoint demo --shape``: small (the realistic CPU shape) or a config.json's shape; the
    demo is then served by model.path, its SNAC beside it; an unknown shape is refused."""
    from lyre.tools.checkpoint import main

    small = demo.demo_config("small")
    assert (small["hidden_size"], small["num_hidden_layers"], small["num_attention_heads"],
            small["num_key_value_heads"], small["vocab_size"]) == (768, 12, 12, 4, orpheus.VOCAB_SIZE)
    shape = tmp_path / "config.json"
    shape.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 10}))
    assert main(["demo", str(tmp_path / "d"), "--shape", str(shape)]) == 0
    assert "model.path=" in capsys.readouterr().out
    written = json.loads((tmp_path / "d" / "llama" / "config.json").read_text())
    assert (written["hidden_size"], written["head_dim"], written["vocab_size"]) == (64, 16, orpheus.VOCAB_SIZE)
    assert demo.demo_is_current(tmp_path / "d", shape=shape) and not demo.demo_is_current(tmp_path / "d")
    cfg = load_config(None, {"model.path": str(tmp_path / "d" / "llama")})
    r = checkpoint.resolve_model(cfg.model, cfg.codec, cache_dir=tmp_path / "no-cache")
    assert r.is_demo and r.snac_dir == tmp_path / "d" / "snac"
    assert read_llama_config(r.llama_dir).hidden_size == 64 and load_llama_weights(r.llama_dir)  # the real path
    assert main(["demo", str(tmp_path / "e"), "--shape", "huge"]) == 2
    assert "unknown shape 'huge'" in capsys.readouterr().err


# --- Llama checkpoints --------------------------------------------------------------------------


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path):
    single = demo.write_llama_checkpoint(tmp_path / "single", SMALL_UNTIED, seed=3)
    sharded = demo.write_llama_checkpoint(tmp_path / "sharded", SMALL_UNTIED, seed=3, max_shard_bytes=60_000)
    index = json.loads((sharded / checkpoint.INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) >= 3
    a = checkpoint.load_llama_weights(single)
    b = checkpoint.load_llama_weights(sharded)
    assert a.keys() == b.keys() and "lm_head.weight" in a
    assert all(torch.equal(a[k], b[k]) for k in a)
    half = checkpoint.load_llama_weights(sharded, dtype=torch.bfloat16)
    assert half["lm_head.weight"].dtype == torch.bfloat16


def test_incomplete_or_malformed_checkpoints_fail_clearly(tmp_path):
    sharded = demo.write_llama_checkpoint(tmp_path / "sharded", SMALL_UNTIED, seed=1, max_shard_bytes=60_000)
    shard = sorted(sharded.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=rf"incomplete: 1 of \d+ shards .* missing \({shard.name}\)"):
        checkpoint.load_llama_weights(sharded)

    d = demo.write_llama_checkpoint(tmp_path / "one", SMALL_UNTIED, seed=1)
    weights = checkpoint.load_llama_weights(d)
    del weights["model.layers.2.mlp.up_proj.weight"]
    save_file(weights, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="1 weights missing, first model.layers.2.mlp.up_proj.weight"):
        checkpoint.load_llama_weights(d)

    cfg = dict(SMALL_UNTIED, intermediate_size=128)
    (d / "config.json").write_text(json.dumps(cfg))
    weights["model.layers.2.mlp.up_proj.weight"] = torch.zeros(128, 64)
    save_file(weights, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"gate_proj.weight has shape \(96, 64\), config.json implies \(128, 64\)"):
        checkpoint.load_llama_weights(d)

    (d / "config.json").write_text(json.dumps(dict(SMALL_UNTIED, model_type="mistral")))
    with pytest.raises(CheckpointError, match="model_type is 'mistral'"):
        checkpoint.read_llama_config(d)
    (d / "config.json").write_text(json.dumps(dict(SMALL_UNTIED, num_key_value_heads=3)))
    with pytest.raises(CheckpointError, match="not a multiple of num_key_value_heads 3"):
        checkpoint.read_llama_config(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        checkpoint.read_llama_config(d)
    with pytest.raises(CheckpointError, match="config.json is missing"):
        checkpoint.read_llama_config(tmp_path / "nowhere")

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        checkpoint.safetensors_files(empty)
    save_file({"a": torch.zeros(1)}, str(empty / "a.safetensors"))
    save_file({"b": torch.zeros(1)}, str(empty / "b.safetensors"))
    with pytest.raises(CheckpointError, match="2 \\*.safetensors files but no model.safetensors.index.json"):
        checkpoint.safetensors_files(empty)
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        checkpoint.load_tokenizer(empty)
    (empty / "tokenizer.json").write_text("{}")
    with pytest.raises(CheckpointError, match="could not be read"):
        checkpoint.load_tokenizer(empty)


# --- SNAC ---------------------------------------------------------------------------------------


def _decode(model, seed=0):
    c0 = torch.tensor([[1, 2]])
    c1 = torch.tensor([[3, 4, 5, 6]])
    c2 = torch.arange(8)[None]
    torch.manual_seed(seed)  # SNAC's NoiseBlock draws fresh noise on every decode
    with torch.inference_mode():
        return model.decode([c0, c1, c2])


def test_snac_loads_from_bin_safetensors_and_old_weight_norm_keys(demo_dir, demo_snac, tmp_path):
    state = demo_snac.state_dict()
    assert any(k.endswith("parametrizations.weight.original0") for k in state)
    reference = _decode(demo_snac)
    assert reference.shape == (1, 1, 2 * orpheus.SAMPLES_PER_FRAME)

    st_dir = tmp_path / "st"
    st_dir.mkdir()
    shutil.copy(demo_dir / "snac" / "config.json", st_dir)
    save_file({k: v.contiguous() for k, v in state.items()}, str(st_dir / "model.safetensors"))
    assert torch.equal(_decode(checkpoint.load_snac(st_dir)), reference)

    old_dir = tmp_path / "old"
    old_dir.mkdir()
    shutil.copy(demo_dir / "snac" / "config.json", old_dir)
    renamed = {
        k.replace("parametrizations.weight.original0", "weight_g").replace("parametrizations.weight.original1", "weight_v"): v
        for k, v in state.items()
    }
    torch.save(renamed, old_dir / "pytorch_model.bin")
    assert torch.equal(_decode(checkpoint.load_snac(old_dir)), reference)


def test_snac_errors_are_clear(demo_dir, tmp_path):
    d = tmp_path / "snac"
    d.mkdir()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        checkpoint.load_snac(d)
    shutil.copy(demo_dir / "snac" / "config.json", d)
    with pytest.raises(CheckpointError, match="no SNAC weights"):
        checkpoint.load_snac(d)
    torch.save({"decoder.bogus": torch.zeros(1)}, d / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="weights do not match config.json"):
        checkpoint.load_snac(d)
    (d / "config.json").write_text(json.dumps({"sampling_rate": 24000, "wings": 2}))
    with pytest.raises(CheckpointError, match="does not describe a SNAC model"):
        checkpoint.load_snac(d)


# --- Hugging Face hub: what is fetched, the cache, offline --------------------------------------

ORPHEUS_REPO_FILES = [
    ".gitattributes",
    "README.md",
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state_0.pth",
    "trainer_state.json",
    "training_args.bin",
    "checkpoint-1000/model-00001-of-00002.safetensors",
    "checkpoint-1000/optimizer.pt",
    "global_step1000/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
]


def test_download_patterns_fetch_only_what_lyre_needs():
    from huggingface_hub.utils import filter_repo_objects  # the filter snapshot_download applies

    chosen = set(filter_repo_objects(ORPHEUS_REPO_FILES, allow_patterns=checkpoint.LLAMA_PATTERNS,
                                     ignore_patterns=checkpoint.IGNORE_PATTERNS))
    assert chosen == {"config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                      "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                      "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"}
    snac_files = ["config.json", "pytorch_model.bin", "README.md", ".gitattributes"]
    assert set(filter_repo_objects(snac_files, allow_patterns=checkpoint.SNAC_PATTERNS,
                                   ignore_patterns=checkpoint.IGNORE_PATTERNS)) == {"config.json", "pytorch_model.bin"}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_download_fails_clearly_when_offline(tmp_path):
    with pytest.raises(CheckpointError, match=r"cannot download canopylabs/orpheus-3b-0.1-ft@main: .*not reachable.*model.path"):
        checkpoint.download("canopylabs/orpheus-3b-0.1-ft", "llama", cache_dir=tmp_path,
                            endpoint=f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(CheckpointError, match="codec.path"):
        checkpoint.download("hubertsiuzdak/snac_24khz", "snac", cache_dir=tmp_path,
                            endpoint=f"http://127.0.0.1:{_closed_port()}")


def make_hf_cache(cache_dir: Path, repo_id: str, source: Path, revision: str = "main") -> Path:
    """Lay ``source``'s files out as the Hugging Face cache does (refs -> snapshot of symlinks)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache_dir / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / revision).write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in source.iterdir():
        os.symlink(f.resolve(), snapshot / f.name)
    return snapshot


def test_find_cached_sees_complete_copies_only(demo_dir, tmp_path):
    assert checkpoint.find_cached("canopylabs/orpheus-3b-0.1-ft", "llama", cache_dir=tmp_path) is None
    snapshot = make_hf_cache(tmp_path, "canopylabs/orpheus-3b-0.1-ft", demo_dir / "llama")
    assert checkpoint.find_cached("canopylabs/orpheus-3b-0.1-ft", "llama", cache_dir=tmp_path) == snapshot
    assert checkpoint.find_cached("canopylabs/orpheus-3b-0.1-ft", "llama", "v2", cache_dir=tmp_path) is None
    (snapshot / "tokenizer.json").unlink()
    assert checkpoint.find_cached("canopylabs/orpheus-3b-0.1-ft", "llama", cache_dir=tmp_path) is None


# --- default model resolution -------------------------------------------------------------------


def test_resolution_order_path_then_cache_then_demo(demo_dir, tmp_path):
    cfg = load_config(None, {"model.demo_dir": str(demo_dir)})
    empty_cache = tmp_path / "empty-cache"
    r = checkpoint.resolve_model(cfg.model, cfg.codec, cache_dir=empty_cache)
    assert r.is_demo and r.llama_dir == demo_dir / "llama" and r.snac_dir == demo_dir / "snac"

    cache = tmp_path / "cache"
    llama_snapshot = make_hf_cache(cache, cfg.model.hf_id, demo_dir / "llama")
    with pytest.raises(CheckpointError, match="SNAC hubertsiuzdak/snac_24khz@main is not in the local Hugging Face cache"):
        checkpoint.resolve_model(cfg.model, cfg.codec, cache_dir=cache)
    snac_snapshot = make_hf_cache(cache, cfg.codec.hf_id, demo_dir / "snac")
    r = checkpoint.resolve_model(cfg.model, cfg.codec, cache_dir=cache)
    assert not r.is_demo and r.llama_dir == llama_snapshot and r.snac_dir == snac_snapshot
    assert "Hugging Face cache canopylabs/orpheus-3b-0.1-ft@main" in r.source

    local = load_config(None, {"model.path": str(demo_dir / "llama"), "codec.path": str(demo_dir / "snac")})
    r = checkpoint.resolve_model(local.model, local.codec, cache_dir=cache)
    assert r.llama_dir == demo_dir / "llama" and "model.path" in r.source
    assert r.is_demo  # a demo's llama/ reached by model.path is still noise, and says so


def test_demo_fallback_is_loud_and_can_be_refused(demo_dir, tmp_path, caplog):
    cfg = load_config(None, {"model.demo_dir": str(demo_dir)})
    checkpoint.resolve_model(cfg.model, cfg.codec, cache_dir=tmp_path)
    assert "DEMO checkpoint" in caplog.text and "NOISE" in caplog.text
    strict = load_config(None, {"model.allow_demo": False})
    with pytest.raises(CheckpointError, match="model.allow_demo is false"):
        checkpoint.resolve_model(strict.model, strict.codec, cache_dir=tmp_path)
    missing = load_config(None, {"model.path": str(tmp_path / "nope")})
    with pytest.raises(CheckpointError, match="model.path .*nope does not exist"):
        checkpoint.resolve_model(missing.model, missing.codec, cache_dir=tmp_path)
    fresh = load_config(None, {"model.demo_dir": str(tmp_path / "fresh")})
    with pytest.raises(CheckpointError, match="demo checkpoint at .*fresh is missing"):
        checkpoint.resolve_model(fresh.model, fresh.codec, cache_dir=tmp_path, create_demo=False)


def test_resolve_command_reports_the_demo():
    """The one ``lyre checkpoint`` process of the suite: the installed command runs and exits 0."""
    out = subprocess.run([sys.executable, "-m", "lyre", "checkpoint", "resolve"], capture_output=True, text=True,
                         cwd=REPO_ROOT, env={**os.environ, "HF_HUB_CACHE": str(REPO_ROOT / "models" / ".no-hf-cache")})
    assert out.returncode == 0, out.stderr
    assert "DEMO" in out.stdout and "models/demo/llama" in out.stdout


def test_download_fetches_only_needed_files_and_the_result_is_served(demo_dir, tmp_path, capfd):
    from tests.support.fake_hub import FakeHub

    llama_src = demo.write_llama_checkpoint(tmp_path / "src", SMALL_UNTIED, seed=5, max_shard_bytes=60_000)
    shutil.copy(demo_dir / "llama" / "tokenizer.json", llama_src)
    decoys = {"optimizer.pt": b"o" * 1000, "training_args.bin": b"t", "checkpoint-10/model.safetensors": b"c",
              "global_step10/mp_rank_00_model_states.pt": b"g", "README.md": b"# model"}
    llama_files = FakeHub.files_of(llama_src, **decoys)
    snac_files = FakeHub.files_of(demo_dir / "snac", **{"README.md": b"# snac"})
    cache = tmp_path / "hf-cache"
    with FakeHub({"org/orpheus-mini": llama_files, "org/snac": snac_files}) as hub:
        llama_dir = checkpoint.download("org/orpheus-mini", "llama", cache_dir=cache, endpoint=hub.endpoint)
        snac_dir = checkpoint.download("org/snac", "snac", cache_dir=cache, endpoint=hub.endpoint)
        needed = {f for f in llama_files if "/" not in f and f not in decoys}
        assert hub.fetched("org/orpheus-mini") == needed
        assert hub.fetched("org/snac") == {"config.json", "pytorch_model.bin"}
        with pytest.raises(CheckpointError, match="does not exist on Hugging Face"):
            checkpoint.download("org/missing", "llama", cache_dir=cache, endpoint=hub.endpoint)
    assert "Fetching" in capfd.readouterr().err  # huggingface_hub's progress bar

    weights = checkpoint.load_llama_weights(llama_dir)
    assert torch.equal(weights["lm_head.weight"], checkpoint.load_llama_weights(llama_src)["lm_head.weight"])
    checkpoint.load_snac(snac_dir)
    # Once in the cache, the configured ids resolve to it without any network.
    cfg = load_config(None, {"model.hf_id": "org/orpheus-mini", "codec.hf_id": "org/snac"})
    r = checkpoint.resolve_model(cfg.model, cfg.codec, cache_dir=cache)
    assert (r.llama_dir, r.snac_dir, r.is_demo) == (llama_dir, snac_dir, False)
