"""build_engine.py: the plan (shipped config, pre-Ada GPU), refusal without a GPU, the FP8 calibration
set, and --backend torch (download from a FakeHub, verify). The script's ``main(argv)`` runs
in-process; once, as a user runs it (``--dry-run``)."""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lyre.config import load_config
from lyre.engine.backend import Environment, Manifest
from lyre.model import checkpoint, demo, orpheus
from lyre.tools.build import BuildError, format_plan, plan_build
from lyre.tools.calibration import records_to_text, write_calibration_set
from tests.support.paths import CONFIG_PATH, REPO_ROOT

H100 = Environment("NVIDIA H100 80GB HBM3", (9, 0), "1.2.1", "10.13.2.6")
T4 = Environment("Tesla T4", (7, 5), "1.2.1", "10.13.2.6")


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("lyre_build_engine_script", REPO_ROOT / "build_engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def build_engine(script, capsys):
    """``build_engine(*argv)`` -> (exit status, stdout, stderr) of ``python build_engine.py *argv``."""

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = script.main(list(argv))
        except SystemExit as e:  # argparse's refusals
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_dry_run_prints_the_full_plan_for_the_shipped_config():
    """The one build_engine.py process of the suite: the script runs as a user runs it and exits 0."""
    out = subprocess.run([sys.executable, "build_engine.py", "--config", str(CONFIG_PATH), "--dry-run"],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    plan = out.stdout
    for expected in ("weights:        FP8", "dtype:          the checkpoint dtype (read once downloaded)", "max_batch_size 32", "max_seq_len 4096",
                     "max_input_len 3072", "max_num_tokens 8192", "paged context FMHA: on",
                     "256 Orpheus prompts over 8 voices", "engines/orpheus-3b-fp8/ with lyre-manifest.json",
                     "canopylabs/orpheus-3b-0.1-ft@main (download"):
        assert expected in plan, expected
    assert "a real build here stops at once" in plan and "no CUDA GPU" in plan  # and it says so without failing


def test_dry_run_for_a_pre_ada_gpu_falls_back_to_fp16_with_a_warning(build_engine):
    code, out, err = build_engine("--config", str(CONFIG_PATH), "--dry-run", "--target-gpu", "Tesla T4=7.5")
    assert code == 0, err
    assert "weights:        FP16 (requested FP8)" in out
    assert "FP8 needs compute capability >= 8.9" in out and "Tesla T4 is 7.5" in out
    assert "calibration:    none" in out


def test_a_real_build_without_gpu_or_library_stops_at_once_and_points_at_torch(build_engine):
    code, _, err = build_engine("--config", str(CONFIG_PATH))
    assert code == 2
    assert "cannot build here" in err and "no CUDA GPU" in err and "tensorrt-llm" in err
    assert "--backend torch" in err and "model.backend=torch" in err


def test_bad_arguments_are_refused(build_engine):
    code, _, err = build_engine("--target-gpu", "Tesla T4=7.5")
    assert code == 2 and "only plans" in err
    code, _, err = build_engine("--dry-run", "--target-gpu", "T4")
    assert code == 2 and "NAME=MAJOR.MINOR" in err
    code, _, err = build_engine("--dry-run", "--set", "build.quantization=int4")
    assert code == 1 and "build.quantization" in err


@pytest.mark.parametrize("env, quant, dtype, warns", [
    (H100, "fp8", "bfloat16", []),  # the checkpoint's dtype: calibrated and run as served
    (Environment("NVIDIA L4", (8, 9), "1.2.1", "10"), "fp8", "bfloat16", []),
    (Environment("NVIDIA A100", (8, 0), "1.2.1", "10"), "bf16", "bfloat16", ["FP8 needs compute capability"]),
])
def test_plan_picks_fp8_only_where_the_gpu_has_it(env, quant, dtype, warns, demo_dir):
    plan = plan_build(load_config(CONFIG_PATH, {"model.path": str(demo_dir / "llama")}), env)
    assert (plan.quantization, plan.dtype) == (quant, dtype)
    assert all(any(w in x for x in plan.warnings) for w in warns) and len(plan.warnings) == len(warns)


def test_bf16_kv_on_a_pre_ampere_gpu_falls_back_to_fp16():
    cfg = load_config(CONFIG_PATH, {"build.kv_cache_dtype": "bfloat16"})
    plan = plan_build(cfg, T4)
    assert (plan.quantization, plan.dtype) == ("fp16", "float16")
    assert any("BF16 needs compute capability >= 8.0" in w for w in plan.warnings)


def test_an_existing_engine_is_kept_unless_forced(tmp_path):
    (tmp_path / "rank0.engine").write_bytes(b"x")
    cfg = load_config(CONFIG_PATH, {"build.engine_dir": str(tmp_path)})
    assert any("--force" in b for b in plan_build(cfg, H100).blockers)
    forced = plan_build(cfg, H100, force=True)
    assert not any("--force" in b for b in forced.blockers) and any("replaced" in w for w in forced.warnings)
    assert "ready to build on this machine" in format_plan(plan_build(
        load_config(CONFIG_PATH, {"build.engine_dir": str(tmp_path / "new"), "model.path": str(tmp_path)}), H100))


def test_the_calibration_set_is_what_inference_sees_through_tensorrt_llms_loader(demo_dir, tmp_path):
    """Orpheus prompts + audio the model generates, read as TensorRT-LLM's calibration loader reads
    them (the checkpoint's tokenizer from the directory it builds from, left padding, the whole set
    in one padded batch, the attention mask then dropped): exactly the ids Lyre serves, one BOS
    (inside the prompt, as served), every record one length, so no padding is calibrated on."""
    from transformers import AutoTokenizer

    cfg = load_config(CONFIG_PATH, {"build.calibration_samples": 10})
    info = write_calibration_set(tmp_path / "calib", cfg, demo_dir / "llama", "cpu", progress=False)
    rows = [json.loads(line)["text"] for line in (tmp_path / "calib" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 10 == info["samples"] and info["dtype"] == "bfloat16"
    loader = AutoTokenizer.from_pretrained(info["checkpoint"], padding_side="left")
    if loader.pad_token is None:
        loader.pad_token = loader.eos_token
    batch = loader(rows, return_tensors="pt", padding=True, truncation=True, max_length=info["max_seq_length"])
    assert batch["attention_mask"].all()  # nothing padded: the loader's dropped mask hides nothing
    assert batch["input_ids"].shape == (10, info["record_tokens"]) and info["record_tokens"] == info["max_seq_length"]
    for i, ids in enumerate(batch["input_ids"].tolist()):
        voice = cfg.model.voices[i % len(cfg.model.voices)]
        sos = ids.index(orpheus.START_OF_SPEECH)
        assert ids[0] == orpheus.START_OF_HUMAN and ids.count(orpheus.BOS) == 1  # as served: no second BOS
        assert loader.decode(ids[1:sos]).startswith(f"<|begin_of_text|>{voice}: ")
        audio = ids[sos + 1:]
        assert len(audio) >= info["continuation_tokens"] == 168
        assert all(orpheus.AUDIO_TOKEN_OFFSET + (k % 7) * 4096 <= t < orpheus.AUDIO_TOKEN_OFFSET + (k % 7 + 1) * 4096
                   for k, t in enumerate(audio))
    assert info["audio_tokens"] == 10 * info["record_tokens"] - sum(r.index(orpheus.START_OF_SPEECH) + 1
                                                                    for r in batch["input_ids"].tolist())
    assert len({r.split(":")[0] for r in rows}) == 8  # every voice
    # the staged directory is the checkpoint (its weights linked), only its tokenizer adds nothing
    staged = Path(info["checkpoint"])
    assert (staged / "model.safetensors").resolve() == (demo_dir / "llama" / "model.safetensors").resolve()
    assert AutoTokenizer.from_pretrained(demo_dir / "llama")("hi")["input_ids"][0] == orpheus.BOS  # (the original adds one)


def test_a_tokenizer_that_cannot_spell_the_ids_is_refused(demo_tokenizer):
    class Lossy:
        def decode(self, ids, skip_special_tokens=False):
            return demo_tokenizer.decode(ids, skip_special_tokens=True)  # drops the special tokens

        def encode(self, text, add_special_tokens=False):
            return demo_tokenizer.encode(text, add_special_tokens=add_special_tokens)

    with pytest.raises(BuildError, match="does not survive the tokenizer"):
        records_to_text(Lossy(), [[orpheus.START_OF_HUMAN, 400, orpheus.AUDIO_TOKEN_OFFSET]])


SMALL = {**demo.DEMO_LLAMA_CONFIG, "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8,
         "tie_word_embeddings": False, "rope_scaling": None, "torch_dtype": "float32"}


def test_backend_torch_downloads_and_verifies_the_checkpoint(build_engine, demo_dir, tmp_path, monkeypatch):
    from tests.support.fake_hub import FakeHub

    src = demo.write_llama_checkpoint(tmp_path / "src", SMALL, seed=3)
    shutil.copy(demo_dir / "llama" / "tokenizer.json", src)
    repos = {"org/orpheus-mini": FakeHub.files_of(src), "org/snac": FakeHub.files_of(demo_dir / "snac")}
    args = ["--config", str(CONFIG_PATH), "--backend", "torch",
            "--set", "model.hf_id=org/orpheus-mini", "--set", "codec.hf_id=org/snac"]

    def hub_at(endpoint: str, cache) -> None:  # what HF_ENDPOINT and HF_HUB_CACHE do for the process
        monkeypatch.setattr(checkpoint, "download", functools.partial(DOWNLOAD, cache_dir=cache, endpoint=endpoint))
        monkeypatch.setattr(checkpoint, "find_cached", functools.partial(FIND_CACHED, cache_dir=cache))

    with FakeHub(repos) as hub:
        hub_at(hub.endpoint, tmp_path / "cache")
        code, out, err = build_engine(*args)
        assert code == 0, err
        assert "2 layers, hidden 64, vocab 300" in out and "ready for the PyTorch backend" in out
        assert hub.fetched("org/orpheus-mini") >= {"config.json", "model.safetensors", "tokenizer.json"}
        # A broken checkpoint is caught by the verification, not at serving time.
        bad = dict(repos["org/orpheus-mini"])
        config = json.loads(bad["config.json"])
        bad["config.json"] = json.dumps({**config, "hidden_size": 128}).encode()
        hub.repos["org/broken"] = bad
        code, _, err = build_engine(*args[:4], "--set", "model.hf_id=org/broken", "--set", "codec.hf_id=org/snac")
        assert code == 1 and "config.json implies" in err
    hub_at("http://127.0.0.1:9", tmp_path / "empty")
    code, _, err = build_engine(*args)
    assert code == 1 and "cannot download org/orpheus-mini" in err


DOWNLOAD, FIND_CACHED = checkpoint.download, checkpoint.find_cached


# --------------------------------------------------------------------------------------------
# the TensorRT-LLM call, against FAKE LLM API classes held to a snapshot of 1.2.1's fields


def test_the_build_passes_tensorrt_llm_only_arguments_its_classes_have(tmp_path, demo_dir):
    from lyre.tools.build import BUILD_KV_CACHE_FRACTION, build_trtllm_engine, llm_arguments
    from tests.support import fake_llmapi

    cfg = load_config(None, {"model.path": str(demo_dir / "llama"), "build.engine_dir": str(tmp_path / "engine"),
                             "build.quantization": "fp16"})
    plan = plan_build(cfg, H100)
    manifest = build_trtllm_engine(cfg, plan, progress=False, api=fake_llmapi.api())
    llm = fake_llmapi.LLM.instances[-1]
    bc = llm.kwargs["build_config"]
    assert (bc.max_batch_size, bc.max_seq_len, bc.max_input_len, bc.max_num_tokens) == (32, 4096, 3072, 8192)
    assert bc.plugin_config.use_paged_context_fmha is True
    assert llm.kwargs["kv_cache_config"].free_gpu_memory_fraction == BUILD_KV_CACHE_FRACTION  # not 0.9
    assert llm.kwargs["dtype"] == "float16" and "quant_config" not in llm.kwargs
    assert llm.saved_to == tmp_path / "engine" and llm.shut_down
    assert Manifest.read(tmp_path / "engine").model_sha256 == manifest.model_sha256
    assert not (tmp_path / ".engine.building").exists()

    fp8 = plan_build(load_config(None, {"model.path": str(demo_dir / "llama")}), H100)
    calibration = {"dataset": str(tmp_path / "calibration"), "samples": 256, "max_seq_length": 310}
    args = llm_arguments(fake_llmapi.api(), cfg, fp8, demo_dir / "llama", calibration)
    assert args["quant_config"].quant_algo == fake_llmapi.QuantAlgo.FP8 and args["quant_config"].kv_cache_quant_algo is None
    calib = args["calib_config"]
    assert (calib.calib_dataset, calib.calib_batches, calib.calib_max_seq_length) == (str(tmp_path / "calibration"), 256, 310)
    assert "cnn_dailymail" not in calib.calib_dataset  # a name the loader would treat as its own dataset
    fake_llmapi.LLM(**args)  # every argument is a TrtLlmArgs field of the right type


@pytest.mark.parametrize("where", ["tensorrt_llm.llmapi.llm_args", "tensorrt_llm.llmapi",
                                   "tensorrt_llm._tensorrt_engine.llm_args", None])
def test_calib_config_is_found_where_a_release_defines_it(monkeypatch, where):
    """1.2.1 defines CalibConfig in tensorrt_llm.llmapi.llm_args (and re-exports it from
    tensorrt_llm.llmapi); later releases define the TensorRT engine's arguments in
    tensorrt_llm._tensorrt_engine.llm_args. Each is tried in turn; none gives a BuildError naming them."""
    import types

    from lyre.tools.build import load_llmapi
    from tests.support import fake_llmapi

    defined = type("CalibConfig", (), {})
    names = ("tensorrt_llm", "tensorrt_llm._tensorrt_engine", "tensorrt_llm.llmapi", "tensorrt_llm.llmapi.llm_args",
             "tensorrt_llm._tensorrt_engine.llm_args")
    modules = {name: types.ModuleType(name) for name in names}
    modules["tensorrt_llm"].__version__ = "1.2.1"
    for module, members in fake_llmapi.SNAPSHOT["modules"].items():
        for name in members:
            if name != "CalibConfig":
                setattr(modules[module], name, getattr(fake_llmapi, name, object()))
    if where is not None:
        modules[where].CalibConfig = defined
    if where != "tensorrt_llm.llmapi.llm_args":
        modules.pop("tensorrt_llm.llmapi.llm_args")  # (a release without that module)
    for name in names:
        monkeypatch.setitem(sys.modules, name, modules.get(name))  # None: the import fails
    if where is None:
        with pytest.raises(BuildError, match="no CalibConfig.*tensorrt_llm._tensorrt_engine.llm_args"):
            load_llmapi()
        return
    api = load_llmapi()
    assert api.CalibConfig is defined and api.version == "1.2.1"
