"""model.backend selection and the engine manifest check (the machine is described, not probed)."""

from __future__ import annotations

import pytest

from lyre.engine.backend import (
    MANIFEST_NAME,
    BackendError,
    Environment,
    Manifest,
    check_manifest,
    hash_files,
    probe_environment,
    select_backend,
)

H100 = Environment("NVIDIA H100 80GB HBM3", (9, 0), "1.2.1", "10.13.2.6")
NO_GPU = Environment(None, None, None, None, "the tensorrt-llm package is not installed")


def manifest(**changes) -> Manifest:
    base = dict(model_source="canopylabs/orpheus-3b-0.1-ft@main", model_revision="abc123", model_sha256="f" * 64,
                tensorrt_llm_version="1.2.1", tensorrt_version="10.13.2.6", gpu_name="NVIDIA H100 80GB HBM3",
                compute_capability=[9, 0], quantization="fp8", kv_cache_dtype="float16",
                build={"max_batch_size": 32, "max_seq_len": 4096})
    return Manifest(**{**base, **changes})


@pytest.fixture
def engine_dir(tmp_path):
    d = tmp_path / "engine"
    d.mkdir()
    manifest().write(d)
    return d


def test_auto_picks_tensorrt_llm_when_engine_library_and_gpu_are_all_there(engine_dir):
    choice = select_backend("auto", engine_dir, H100)
    assert choice.name == "trtllm" and "H100" in choice.reason and str(engine_dir) in choice.reason


@pytest.mark.parametrize("env, missing", [
    (NO_GPU, "no CUDA GPU"),
    (Environment("NVIDIA H100 80GB HBM3", (9, 0), None, None, "import tensorrt_llm failed: libmpi.so.40"),
     "libmpi"),
])
def test_auto_falls_back_to_torch_and_says_why(engine_dir, env, missing):
    choice = select_backend("auto", engine_dir, env)
    assert choice.name == "torch" and missing in choice.reason


def test_auto_without_an_engine_uses_torch_and_points_at_the_builder(tmp_path):
    choice = select_backend("auto", tmp_path / "nothing", H100)
    assert choice.name == "torch" and "no engine is built" in choice.reason and "build_engine.py" in choice.reason


def test_trtllm_requested_where_it_cannot_run_is_refused_with_everything_missing(tmp_path):
    with pytest.raises(BackendError) as err:
        select_backend("trtllm", tmp_path / "nothing", NO_GPU)
    text = str(err.value)
    assert "no CUDA GPU" in text and "not installed" in text and "no engine" in text and "model.backend=torch" in text


def test_torch_is_always_torch(tmp_path):
    assert select_backend("torch", tmp_path, H100).name == "torch"


def test_this_machine_is_probed_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this check describes a CPU-only machine")
    env = probe_environment()
    assert not env.has_gpu and env.tensorrt_llm_version is None and "not installed" in env.import_error


def test_a_matching_manifest_loads(engine_dir):
    assert check_manifest(engine_dir, H100).quantization == "fp8"


@pytest.mark.parametrize("env, expected", [
    (Environment("NVIDIA A10G", (8, 6), "1.2.1", "10.13.2.6"), ["GPU: built for NVIDIA H100", "compute capability"]),
    (Environment("NVIDIA H100 80GB HBM3", (9, 0), "1.2.0", "10.13.2.6"), ["TensorRT-LLM: built with 1.2.1"]),
    (Environment("NVIDIA H100 80GB HBM3", (9, 0), "1.2.1", "10.11.0.33"), ["TensorRT: built with 10.13.2.6"]),
    (NO_GPU, ["no CUDA GPU"]),
])
def test_a_manifest_mismatch_is_refused_naming_each_difference(engine_dir, env, expected):
    with pytest.raises(BackendError) as err:
        check_manifest(engine_dir, env)
    text = str(err.value)
    assert all(e in text for e in expected) and "rebuild" in text and "build_engine.py" in text


def test_a_missing_or_broken_manifest_is_refused(tmp_path):
    with pytest.raises(BackendError, match="no lyre-manifest.json.*build_engine.py"):
        check_manifest(tmp_path, H100)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(BackendError, match="not a valid engine manifest"):
        check_manifest(tmp_path, H100)


def test_hash_covers_names_and_contents(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"x" * 10)
    b.write_bytes(b"y")
    h = hash_files([a, b])
    assert h == hash_files([b, a])  # order-independent
    b.write_bytes(b"z")
    assert hash_files([a, b]) != h
