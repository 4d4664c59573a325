"""lyre.config: the shipped file, dotted overrides, and refusals that name key, value and rule."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from lyre.config import ConfigError, LyreConfig, config_to_dict, load_config
from tests.support.paths import CONFIG_PATH, REPO_ROOT

SEED_004_SCHEDULER = {
    "max_concurrent_sessions": 32,
    "max_batch_size": 16,
    "ttfb_priority_tokens": 20,
    "flush_first_n_tokens": 7,
    "flush_every_n_tokens": 14,
}


def test_shipped_file_holds_seed_004_keys_and_every_section(shipped_config):
    s = shipped_config.scheduler
    assert {k: getattr(s, k) for k in SEED_004_SCHEDULER} == SEED_004_SCHEDULER
    conv, longform = shipped_config.tuning["conversational"], shipped_config.tuning["longform"]
    assert (conv.max_text_chars, conv.target_concurrent, conv.target_ttfb_ms) == (250, 24, 100)
    assert (longform.max_text_chars, longform.target_concurrent, longform.target_ttfb_ms) == (5000, 16, 300)
    raw = yaml.safe_load(CONFIG_PATH.read_text())
    for section in ("model", "codec", "kv_cache", "sampling", "scheduler", "tuning", "server", "build"):
        assert section in raw, section


def test_shipped_file_spells_out_every_default():
    # The file documents the defaults: it names every key, with the value the code uses without it.
    raw = yaml.safe_load(CONFIG_PATH.read_text())
    assert raw == config_to_dict(LyreConfig())


def test_every_key_in_shipped_file_is_commented():
    # A key is commented when its own line or the line above carries a comment. Section headers
    # (a key with nothing after the colon) are exempt: their keys carry the comments.
    lines = CONFIG_PATH.read_text().splitlines()
    uncommented = [
        line.strip()
        for i, line in enumerate(lines)
        if re.match(r"^\s*[a-z_]+:\s*\S", line)
        and "#" not in line
        and not (i > 0 and lines[i - 1].strip().startswith("#"))
    ]
    assert uncommented == []


def test_defaults_without_a_file():
    cfg = load_config(None)
    assert cfg == LyreConfig()
    assert cfg.sampling.temperature == 0.6 and cfg.sampling.top_p == 0.8
    assert cfg.sampling.repetition_penalty == 1.1 and cfg.sampling.top_k == 0
    assert cfg.active_profile.max_text_chars == 250


def test_dotted_overrides_from_strings_and_mapping():
    cfg = load_config(CONFIG_PATH, ["scheduler.max_batch_size=8", "sampling.seed=7", "model.path=null",
                                    "tuning.longform.max_text_chars=900", "profile=longform"])
    assert cfg.scheduler.max_batch_size == 8
    assert cfg.sampling.seed == 7 and cfg.model.path is None
    assert cfg.tuning["longform"].max_text_chars == 900
    assert cfg.tuning["longform"].target_concurrent == 16  # untouched sibling keeps its value
    assert cfg.active_profile.max_text_chars == 900
    cfg2 = load_config(None, {"kv_cache.free_gpu_memory_fraction": 1, "model.voices": ["tara", "zac"]})
    assert cfg2.kv_cache.free_gpu_memory_fraction == 1.0 and isinstance(cfg2.kv_cache.free_gpu_memory_fraction, float)
    assert cfg2.model.voices == ("tara", "zac")


def test_override_adds_a_tuning_profile():
    cfg = load_config(None, ["tuning.ivr.max_text_chars=120", "profile=ivr"])
    assert cfg.active_profile.max_text_chars == 120


@pytest.mark.parametrize(
    "override, pieces",
    [
        ("scheduler.max_batch_sze=8", ["scheduler.max_batch_sze", "unknown", "did you mean 'max_batch_size'"]),
        ("schedular.max_batch_size=8", ["schedular", "unknown", "scheduler"]),
        ("scheduler.max_batch_size=eight", ["scheduler.max_batch_size", "'eight'", "expected an integer"]),
        ("scheduler.max_batch_size=2.5", ["scheduler.max_batch_size", "2.5", "expected an integer"]),
        ("scheduler.max_batch_size=true", ["scheduler.max_batch_size", "True", "expected an integer"]),
        ("scheduler.max_batch_size=0", ["scheduler.max_batch_size", "= 0", "must be >= 1"]),
        ("scheduler.max_batch_size=64", ["scheduler.max_batch_size", "64", "max_concurrent_sessions (32)"]),
        ("scheduler.flush_every_n_tokens=10", ["scheduler.flush_every_n_tokens", "10", "multiple of 7"]),
        ("scheduler.policy=lifo", ["scheduler.policy", "'lifo'", "'fair', 'deadline'"]),
        ("sampling.top_p=0", ["sampling.top_p", "0", "must be >= 0.001"]),
        ("sampling.temperature=-1", ["sampling.temperature", "-1", ">= 0.0"]),
        ("sampling.max_tokens=5000", ["sampling.max_tokens", "5000", "kv_cache.max_seq_len (4096)"]),
        ("server.port=70000", ["server.port", "70000", "<= 65535"]),
        ("model.default_voice=bob", ["model.default_voice", "'bob'", "tara"]),
        ("profile=radio", ["profile", "'radio'", "conversational, longform"]),
        ("model.backend=onnx", ["model.backend", "'onnx'", "'auto', 'torch', 'trtllm'"]),
        ("codec.noise=maybe", ["codec.noise", "'maybe'", "true or false"]),
        ("codec.mode=fast", ["codec.mode", "'fast'", "'stream', 'window'"]),
        ("codec.runtime=tensorrt", ["codec.runtime", "'tensorrt'", "'onnxruntime', 'openvino'"]),
        ("codec.max_chunk_frames=1", ["codec.max_chunk_frames", "1", "flush_every_n_tokens / 7 (2)"]),
        ("codec.max_round_ms=0", ["codec.max_round_ms", "0", "must be > 0.0"]),
        ("scheduler.consumer_timeout_s=0.3", ["scheduler.consumer_timeout_s", "0.3", "longest chunk", "0.34 s"]),
        ("scheduler.flush_first_n_tokens=35", ["codec.warmup_frames", "4", "flush_first_n_tokens / 7 (5)"]),
        ("scheduler.session_timeout_s=.inf", ["scheduler.session_timeout_s", "inf", "<= 86400"]),
        ("scheduler.max_buffer_s=0", ["scheduler.max_buffer_s", "0", "must be > 0.0"]),
        ("batch.completion_window=1w", ["batch.completion_window", "'1w'", "24h, 90m or 3600s"]),
        ("batch.completion_window=30d", ["batch.completion_window", "'30d'", "max_completion_window_s (604800 s)"]),
        ("scheduler=3", ["scheduler", "3", "mapping"]),
        ("novalue", ["novalue", "section.key=value"]),
    ],
)
def test_bad_values_are_refused_with_key_value_and_rule(override, pieces):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG_PATH, [override])
    message = str(info.value)
    for piece in pieces:
        assert piece in message, f"{piece!r} not in {message!r}"


def test_yaml_on_and_off_are_the_words_a_choice_expects():
    assert load_config(None, ["codec.overlap=on"]).codec.overlap == "on"  # YAML reads on/off as booleans
    assert load_config(None, ["codec.overlap=off"]).codec.overlap == "off"


def test_bad_file_contents_are_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("scheduler:\n  max_batch_size: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"scheduler.max_batch_size.*\[1, 2\].*expected an integer.*bad.yaml"):
        load_config(bad)
    bad.write_text("scheduler: {max_batch_size: 4\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == LyreConfig()


def test_cli_set_flag_prints_resolved_config_and_refuses_bad_keys():
    run = [sys.executable, "-m", "lyre", "config", "--config", str(CONFIG_PATH)]
    ok = subprocess.run(run + ["--set", "scheduler.max_batch_size=8", "--set", "scheduler.policy=deadline"],
                        capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    printed = yaml.safe_load(ok.stdout)
    assert printed["scheduler"]["max_batch_size"] == 8 and printed["scheduler"]["policy"] == "deadline"
    bad = subprocess.run(run + ["--set", "scheduler.max_batch_size=0"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert bad.returncode == 2
    assert "scheduler.max_batch_size" in bad.stderr and "must be >= 1" in bad.stderr


def test_voice_aliases_resolve_in_any_case_and_must_name_a_voice():
    cfg = load_config(None, {"model.voice_aliases": {"Agent": "leo"}})
    assert cfg.model.resolve_voice("agent") == "leo" and cfg.model.resolve_voice("ALLOY") == "tara"  # merged
    assert cfg.model.resolve_voice("Zoe") == "zoe" and cfg.model.resolve_voice("nobody") is None
    with pytest.raises(ConfigError, match=r"model.voice_aliases.alloy' = 'ghost' is not allowed: must be one of"):
        load_config(None, {"model.voice_aliases.alloy": "ghost"})
    with pytest.raises(ConfigError, match="'tara' is a voice's own name"):
        load_config(None, {"model.voice_aliases": {"tara": "leo"}})
