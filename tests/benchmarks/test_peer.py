"""The llama.cpp peer of ``benchmark.py --baseline llamacpp``: the GGUF export read back with llama.cpp's
own ``gguf`` reader, the Orpheus servers' sliding-window SNAC decoder against an exact decode, and —
where llama-cpp-python is installed (``.[peer]``, built from source: not in the default setup) —
llama.cpp computing the same logits as Lyre's engine from the exported file, and the peer serving
audio through the real server."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from lyre.benchmarks.peer.gguf_export import export, rope_divisors
from lyre.benchmarks.peer.snac_window import SlidingWindowDecoder
from lyre.codec import configure_noise
from lyre.engine.torch.llama import rope_inv_freq
from lyre.model import checkpoint, orpheus
from lyre.service.stream import to_int16

gguf = pytest.importorskip("gguf")

try:
    import llama_cpp  # noqa: F401

    HAVE_LLAMA_CPP = True
except ImportError:
    HAVE_LLAMA_CPP = False
needs_llama_cpp = pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python is not installed (pip install "
                                                                 "-e '.[peer]'; it builds llama.cpp from source)")


@pytest.fixture(scope="module")
def exported(demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf")
    return {kind: export(demo_dir / "llama", out / f"demo-{kind}.gguf", kind) for kind in ("f32", "q8_0")}


@pytest.fixture(scope="module")
def read(exported):
    """llama.cpp's reader of each exported file, read once (parsing a 156k-token vocabulary takes seconds)."""
    return {kind: gguf.GGUFReader(path) for kind, path in exported.items()}


def _tensors(reader) -> dict:
    return {t.name: t for t in reader.tensors}


@pytest.mark.slow  # (the llama.cpp peer's export, ~15 s)
def test_gguf_holds_every_weight_in_llama_cpp_layout(demo_dir, exported, read):
    cfg = checkpoint.read_llama_config(demo_dir / "llama")
    weights = checkpoint.load_llama_weights(demo_dir / "llama", cfg, dtype=torch.float32)
    tensors = _tensors(read["f32"])
    assert len([n for n in tensors if n.startswith("blk.")]) == 9 * cfg.num_hidden_layers
    assert "output.weight" not in tensors  # tied: llama.cpp reads token_embd
    np.testing.assert_array_equal(tensors["token_embd.weight"].data, weights["model.embed_tokens.weight"].numpy())
    # q's rows interleaved per head for GGML's RoPE: each head's two halves alternate
    q = weights["model.layers.0.self_attn.q_proj.weight"].numpy()
    hd = cfg.head_dim
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight"].data[1], q[hd // 2])
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight"].data[hd + 2], q[hd + 1])
    # Llama 3's RoPE scaling, as the divisors llama.cpp applies to its base frequencies
    divisors = tensors["rope_freqs.weight"].data
    base = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2) / hd))
    np.testing.assert_allclose(base / divisors, rope_inv_freq(cfg).numpy(), rtol=1e-5)
    assert divisors.min() == 1.0 and divisors.max() == cfg.rope_scaling["factor"]
    q8 = _tensors(read["q8_0"])
    assert q8["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert q8["blk.0.ffn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32  # norms stay f32
    assert exported["q8_0"].stat().st_size < 0.3 * exported["f32"].stat().st_size


@pytest.mark.slow  # (reads the exported GGUF)
def test_gguf_vocabulary_is_the_checkpoints(demo_dir, demo_tokenizer, read):
    reader = read["f32"]
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == checkpoint.read_llama_config(demo_dir / "llama").vocab_size
    text = lambda i: bytes(tokens.parts[tokens.data[i]]).decode()  # noqa: E731
    assert text(orpheus.END_OF_SPEECH) == demo_tokenizer.id_to_token(orpheus.END_OF_SPEECH)
    assert text(orpheus.AUDIO_TOKEN_OFFSET + 5) == "<custom_token_15>"


def test_gguf_export_refuses_an_unknown_type(demo_dir, tmp_path):
    with pytest.raises(ValueError, match="f32, f16, q8_0"):
        export(demo_dir / "llama", tmp_path / "x.gguf", "q4_k")
    assert rope_divisors(checkpoint.read_llama_config(demo_dir / "llama")) is not None


def test_sliding_window_plays_each_frame_but_the_last_two_after_decoding_it_four_times(demo_dir):
    snac = configure_noise(checkpoint.load_snac(demo_dir / "snac"), False)
    rng = np.random.default_rng(0)
    frames = [tuple(int(x) for x in rng.integers(0, orpheus.CODEBOOK_SIZE, 7)) for _ in range(10)]
    window = SlidingWindowDecoder(snac)
    chunks = [window.feed([f]) for f in frames]
    assert [len(c) for c in chunks] == [1, 0, 0, 1, 1, 1, 1, 1, 1, 1]  # first audio at once, then a 2-frame lag
    played = [pcm for c in chunks for pcm in c]
    assert [len(p) for p in played] == [orpheus.SAMPLES_PER_FRAME] * 8  # frames 8 and 9 are never played
    assert window.decoded_frames == 1 + 7 * 4
    codes = [torch.from_numpy(c)[None] for c in orpheus.frames_to_codes(frames)]
    with torch.inference_mode():
        exact = to_int16(snac.decode(codes)[0, 0].numpy())
    for k, pcm in enumerate(played[1:], start=1):  # each window's middle is that frame's audio
        ref = exact[k * orpheus.SAMPLES_PER_FRAME:(k + 1) * orpheus.SAMPLES_PER_FRAME]
        assert np.corrcoef(ref.astype(float), pcm.astype(float))[0, 1] > 0.99


@needs_llama_cpp
@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_llama_cpp_computes_the_checkpoints_logits_from_the_export(demo_dir, demo_tokenizer, exported, kind):
    import transformers

    from lyre.benchmarks.peer.llamacpp import LlamaCpp, PeerSampling, PeerSequence

    prompt = orpheus.build_prompt_ids(demo_tokenizer, "The export must compute the same function.", "tara")
    hf = transformers.LlamaForCausalLM.from_pretrained(demo_dir / "llama", dtype=torch.float32).eval()
    with torch.inference_mode():
        reference = hf(torch.tensor([prompt])).logits[0, -1].numpy()  # (vocab,) after the prompt
    llama = LlamaCpp(exported[kind], 1, 256, threads=1)
    try:
        seq = PeerSequence(prompt, PeerSampling(0.0, 1.0, 0, 1.0, 2, constrain_audio=False))
        llama.admit(seq)
        llama.step()
        logits = llama.logits(len(prompt) - 1).copy()
    finally:
        llama.close()
    assert seq.generated == [int(logits.argmax())]
    scale = np.abs(reference).max()
    if kind == "f32":  # the same function, to float rounding (and llama.cpp's f16 KV cache)
        assert np.abs(logits - reference).max() < 0.02 * scale
        assert seq.generated == [int(reference.argmax())]
    else:  # 8-bit weights: close, most of the top ten kept
        assert np.abs(logits - reference).max() < 0.15 * scale
        assert len(set(np.argsort(logits)[-10:]) & set(np.argsort(reference)[-10:])) >= 7


def test_without_llama_cpp_the_peer_is_refused_with_the_extra_to_install(bench, demo_dir, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # (import llama_cpp raises ImportError)
    run = bench("--mode", "engine", "--checkpoint", str(demo_dir / "llama"), "--concurrency", "1",
                "--max-tokens", "7", "--baseline-requests", "0", "--baseline", "llamacpp",
                "--set", f"data_dir={tmp_path}")
    assert run.returncode == 1
    assert "the llama.cpp peer needs llama-cpp-python and gguf: pip install -e '.[peer]'" in run.stderr
    assert not list(tmp_path.glob("peer/*.gguf"))  # said before any export


@needs_llama_cpp
def test_engine_mode_measures_llama_cpp_at_every_level(bench, demo_dir, tmp_path):
    out = tmp_path / "engine.json"
    run = bench("--mode", "engine", "--checkpoint", str(demo_dir / "llama"), "--concurrency", "1,3",
                "--max-tokens", "14", "--baseline-requests", "0", "--baseline", "llamacpp",
                "--set", f"data_dir={tmp_path}", "--output", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    peer = result["llamacpp"]
    assert peer["type"] == "f32" and [lv["concurrency"] for lv in peer["levels"]] == [1, 3]
    assert [lv["tokens"] for lv in peer["levels"]] == [14, 42]  # every sequence ran to max_tokens
    for lyre, other in zip(result["engine"], peer["levels"], strict=True):
        assert lyre["vs_llamacpp"] == pytest.approx(lyre["tokens_per_s"] / other["tokens_per_s"])
    assert "vs llama.cpp" in run.stdout and "f32 GGUF" in run.stdout


@needs_llama_cpp
def test_scaling_mode_serves_the_peer_through_the_same_protocol(bench, server, tmp_path):
    from tests.benchmarks.test_load import QUICK

    out = tmp_path / "scaling.json"
    run = bench("--mode", "scaling", "--levels", "2", "--requests", "2", "--url", server.http,
                "--baseline", "llamacpp", "--output", str(out), *QUICK, "--set", f"data_dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    peer = result["engines"]["llamacpp"]["levels"][0]
    assert peer["success_rate"] == 1.0 and peer["audio_s_per_wall_s"] > 0 and peer["server_tokens_per_s"] > 0
    # 14 tokens = 2 frames a segment: the sliding window plays the first frame alone, never the second
    for r in peer["per_request"]:
        frames = r["audio_s"] * orpheus.SAMPLE_RATE / orpheus.SAMPLES_PER_FRAME
        assert frames >= 1 and frames == pytest.approx(round(frames), abs=1e-6), r
    assert [r["concurrency"] for r in result["ratios_vs_llamacpp"]["lyre"]] == [2]
    cost = peer["cpu_s_per_audio_s"]  # llama.cpp's decode, its sampler chain and the window decodes charged
    assert cost["model"] > 0 and cost["sampling"] > 0 and cost["codec"] > 0
    assert list(tmp_path.glob("peer/*-f32.gguf"))
