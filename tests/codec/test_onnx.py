"""The ONNX runtimes of the streaming decoder against torch: same frames, same noise, same audio."""

from __future__ import annotations

import fcntl
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from lyre.codec import CodecError, StreamSettings, build_codec, configure_noise, resolve_runtime
from lyre.codec import onnx as codec_onnx
from lyre.codec.stream import StreamCodec
from lyre.codec.streaming import StreamingSnac
from lyre.config import load_config
from lyre.model import checkpoint
from tests.support.codec import F, feed, offline, random_frames
from tests.support.locks import someone_waits_on
from tests.support.paths import REPO_ROOT
from tests.support.waiting import until

CACHE = REPO_ROOT / "models" / "codec-onnx"  # shared with the servers the other tests start


def runtime_or_skip(name: str) -> None:
    if (why := codec_onnx.available(name)) is not None:
        pytest.skip(f"codec runtime {name} not testable here: {why}")


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("noise", [False, True])
def test_an_onnx_runtime_streams_the_same_audio_as_torch(request, runtime, noise):
    """Without noise on the tests' narrow SNAC (the graphs the tests' servers decode with); with noise
    on the demo's SNAC, as the server runs it by default (setup.sh exported those graphs: an export
    takes ~15 s a graph on 2 cores, and each is made once)."""
    runtime_or_skip(runtime)
    frames = random_frames(14, seed=21)
    snac_dir = request.getfixturevalue("demo_dir") / "snac" if noise else request.getfixturevalue("snac_dir")
    snac = configure_noise(checkpoint.load_snac(snac_dir), noise, seed=7)
    model = StreamingSnac(snac).eval()
    runner, offline_runner = (codec_onnx.RUNNERS[runtime](model, CACHE, kind) for kind in codec_onnx.KINDS)
    settings = StreamSettings(warmup_frames=3)
    ref, _ = feed(StreamCodec(model, noise_seed=7), frames, settings, [1] * 14)  # the warm-up's prefix decodes too
    got, stream = feed(StreamCodec(model, runner, runtime, noise_seed=7, offline=offline_runner), frames, settings,
                       [1] * 14)
    ref, got = np.concatenate(ref), np.concatenate(got)
    assert len(got) == 14 * F and stream.provisional_end > 0
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    if not noise:  # and the stream is still exact after its warm-up
        join = stream.provisional_end + settings.holdback
        assert np.abs(got[join:] - offline(snac, frames)[join:]).max() <= 1e-5 * np.abs(ref).max()


def test_the_graph_is_exported_once_and_reused(snac_dir):
    runtime_or_skip("onnxruntime")
    model = StreamingSnac(configure_noise(checkpoint.load_snac(snac_dir), False)).eval()
    first = codec_onnx.OnnxRunner(model, CACHE, "stream").path
    stamp = first.stat().st_mtime_ns
    again = codec_onnx.OnnxRunner(model, CACHE, "stream").path
    assert again == first and again.stat().st_mtime_ns == stamp
    assert codec_onnx.graph_key(model, "stream") != codec_onnx.graph_key(model, "offline")


def test_a_process_that_finds_a_graph_being_exported_waits_for_it_instead_of_exporting_again(snac_dir, tmp_path):
    """Servers (or test workers) sharing codec.onnx_dir: the second waits on the first's lock, then
    takes its file. Here the test holds the lock, as an exporting process would."""
    model = StreamingSnac(configure_noise(checkpoint.load_snac(snac_dir), False)).eval()
    path = tmp_path / f"snac-stream-{codec_onnx.graph_key(model, 'stream')}.onnx"
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waiter = ThreadPoolExecutor(1).submit(codec_onnx.exported, model, "stream", tmp_path)
        until(lambda: someone_waits_on(lock), what="the second exporter to wait on the lock")
        path.write_bytes(b"the first process's graph")
    assert waiter.result(timeout=60) == path and path.read_bytes() == b"the first process's graph"


def test_runtime_choice_and_clear_refusals(snac_dir):
    runtime_or_skip("onnxruntime")
    assert resolve_runtime("auto", "cpu") == "onnxruntime"
    assert resolve_runtime("auto", "cuda") == "torch"
    assert resolve_runtime("torch", "cpu") == "torch"
    with pytest.raises(CodecError, match="CPU only"):
        resolve_runtime("onnxruntime", "cuda")
    cfg = load_config(None, {"codec.runtime": "onnxruntime", "codec.onnx_dir": str(CACHE)})
    snac = configure_noise(checkpoint.load_snac(snac_dir), False)
    codec = build_codec(cfg.codec, snac, "cpu", snac.quantizer.quantizers[0].codebook.weight.dtype)
    assert codec.stats().runtime == "onnxruntime" and codec.stats().mode == "stream"
    window = build_codec(load_config(None, {"codec.mode": "window"}).codec, snac, "cpu", codec.dtype)
    assert window.stats().mode == "window"


def test_prepare_exports_what_the_configured_runtime_needs(snac_dir, capsys):
    """``lyre codec prepare``: once as a user runs it (the one such process of the suite), then its
    ``main(argv)`` in-process."""
    import subprocess
    import sys

    from lyre.tools.codec import main

    # the graphs the tests' servers decode with (exported once for both: the narrow SNAC, no noise)
    run = subprocess.run([sys.executable, "-m", "lyre", "codec", "prepare", "--set", f"codec.path={snac_dir}",
                          "--set", "codec.noise=false"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "codec ready: stream mode, onnxruntime" in run.stdout
    assert main(["prepare", "--set", "codec.mode=window"]) == 0
    assert "nothing to prepare" in capsys.readouterr().out
    assert main(["prepare", "--set", "codec.runtime=tensorrt"]) == 1
    assert "codec.runtime" in capsys.readouterr().err


def _rounds(codec, streams_frames, settings):
    """Every stream gets one frame a round and every due job of the round is decoded in one
    ``codec.decode`` (as the audio pipeline batches the sessions that flush together)."""
    streams = [codec.new_stream(settings) for _ in streams_frames]
    audio = [[] for _ in streams]
    for r in range(len(streams_frames[0]) + 1):
        jobs = []
        for s, frames in zip(streams, streams_frames, strict=True):
            if r < len(frames):
                s.push(frames[r : r + 1])
            else:
                s.finish()
            while (job := s.plan(1, need_audio=True)) is not None:
                jobs.append(job)
                break
        for job, result in zip(jobs, codec.decode(jobs), strict=True):
            audio[streams.index(job.stream)].append(job.stream.complete(job, result))
    for i, s in enumerate(streams):  # the rest of each finished stream
        while (job := s.plan(1, need_audio=True)) is not None:
            audio[i].append(s.complete(job, codec.decode([job])[0]))
    return [np.concatenate(a) for a in audio]


@pytest.mark.parametrize("noise", [False, True])
def test_a_batch_split_across_concurrent_calls_decodes_the_same_audio(request, noise):
    """codec.cpu_threads 2 with onnxruntime: a round's batched call runs as 2 one-thread calls at
    once, and every stream's audio is what one call gives — its noise too, with a seed."""
    import threading

    runtime_or_skip("onnxruntime")
    snac_dir = request.getfixturevalue("demo_dir") / "snac" if noise else request.getfixturevalue("snac_dir")
    model = StreamingSnac(configure_noise(checkpoint.load_snac(snac_dir), noise, seed=7)).eval()
    runner, offline_runner = (codec_onnx.RUNNERS["onnxruntime"](model, CACHE, kind, 1) for kind in codec_onnx.KINDS)
    streams_frames = [random_frames(6, seed=40 + i) for i in range(5)]
    settings = StreamSettings(warmup_frames=2)
    one = _rounds(StreamCodec(model, runner, "onnxruntime", offline=offline_runner, noise_seed=7), streams_frames,
                  settings)
    split = StreamCodec(model, runner, "onnxruntime", offline=offline_runner, parallel=2, noise_seed=7)
    two = _rounds(split, streams_frames, settings)
    for a, b in zip(one, two, strict=True):
        assert len(a) == len(b) == 6 * F
        np.testing.assert_allclose(b, a, atol=1e-5 * np.abs(a).max())

    # the two halves of one round really run at once: the first waits for the second to start
    second_started, rows = threading.Event(), []

    def meeting(*args):
        rows.append(len(args[0]))
        if len(rows) == 1:
            assert second_started.wait(timeout=60), "the second half never ran beside the first"
        else:
            second_started.set()
        return offline_runner(*args)

    split.offline = meeting  # (first chunks: prefix decodes)
    streams = [split.new_stream(settings) for _ in range(4)]
    for s, frames in zip(streams, streams_frames, strict=False):
        s.push(frames[:2])
    jobs = [s.plan(1, need_audio=True) for s in streams]
    results = split.decode(jobs)
    split.close()
    assert sorted(rows) == [2, 2] and not any(isinstance(r, Exception) for r in results)
