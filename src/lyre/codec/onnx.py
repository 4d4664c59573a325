"""``codec.runtime: onnxruntime | openvino``: the streaming decoder exported to ONNX, run by ONNX
Runtime or OpenVINO.

Two graphs are exported from the same layers and weights: ``stream`` (:class:`StreamingSnac`:
codes, positions, noise, states -> audio, states) and ``offline`` (:class:`OfflineSnac`: whole
frames -> audio, for the warm-up chunks), with dynamic batch and length. Each is exported once by
``torch.onnx.export`` and cached on disk under a name derived from its weights, so a restart loads
it in a second; it is re-exported whenever the weights, the noise setting, torch or Lyre's graph
change. Each runner gets its intra-op thread count from :func:`lyre.codec.runtime_threads` (ONNX
Runtime one thread per call, several calls at once; OpenVINO the codec's cores); ONNX Runtime
runs without spin-waiting so that it does not take the cores from the token engine between calls.
Tests check their audio against torch's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lyre.codec.streaming import OfflineSnac, StreamingSnac

log = logging.getLogger("lyre.codec")

GRAPH_VERSION = 2  # bump when what StreamingSnac or OfflineSnac compute changes
KINDS = ("stream", "offline")


class OnnxUnavailable(RuntimeError):
    """ONNX Runtime / OpenVINO (or the exporter's packages) cannot be used here."""


def available(runtime: str = "onnxruntime") -> str | None:
    """None when ``runtime`` (onnxruntime or openvino) can be used, else why not."""
    try:
        import onnxscript  # noqa: F401

        if runtime == "openvino":
            import openvino  # noqa: F401
        else:
            import onnxruntime  # noqa: F401
    except ImportError as e:
        return f"{e.name} is not installed (pip install {runtime} onnxscript)"
    return None


def _graph(model: StreamingSnac, kind: str) -> tuple[nn.Module, tuple, tuple, list[str], list[str]]:
    """(module, example inputs, dynamic shapes, input names, output names) of graph ``kind``."""
    b, c = 2, 2
    batch, length = torch.export.Dim("batch", min=1, max=4096), torch.export.Dim("length", min=1, max=1024)
    codes = (torch.zeros(b, c, dtype=torch.long), torch.zeros(b, 2 * c, dtype=torch.long),
             torch.zeros(b, 4 * c, dtype=torch.long))
    code_shapes = ({0: batch, 1: length}, {0: batch, 1: 2 * length}, {0: batch, 1: 4 * length})
    noise = [torch.zeros(b, 1, c * p) for p in model.noise_per_frame]
    noise_shapes = [{0: batch, 2: p * length} for p in model.noise_per_frame]
    noise_names = [f"noise_{i}" for i in range(len(noise))]
    if kind == "offline":
        return (OfflineSnac(model), (*codes, noise), (*code_shapes, noise_shapes),
                ["c0", "c1", "c2", *noise_names], ["audio"])
    states = [torch.zeros(b, ch, k) for ch, k in model.state_shapes]
    state_names = [f"state_{i}" for i in range(len(states))]
    positions = (torch.zeros(b, dtype=torch.long), torch.full((b,), StreamingSnac.OPEN, dtype=torch.long))
    return (model, (*codes, *positions, noise, states),
            (*code_shapes, {0: batch}, {0: batch}, noise_shapes, [{0: batch} for _ in states]),
            ["c0", "c1", "c2", "fed", "end", *noise_names, *state_names], ["audio", *[f"new_{s}" for s in state_names]])


def graph_key(model: StreamingSnac, kind: str) -> str:
    """Hash of what graph ``kind`` computes: the weights, the layer layout, torch's version, the graph version."""
    h = hashlib.sha256(f"{kind}:{GRAPH_VERSION}:{torch.__version__}:{model.noise_per_frame}:{model.state_shapes}".encode())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def export(model: StreamingSnac, kind: str, path: Path) -> None:
    """Write graph ``kind`` of ``model`` to ``path`` (~15 s on 2 CPU cores)."""
    module, example, shapes, inputs, outputs = _graph(model, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".partial-{os.getpid()}")
    chatter = io.StringIO()  # the exporter prints its progress and logs every optimisation pass
    logging.disable(logging.WARNING)  # (at start-up, before any engine thread logs)
    try:
        with torch.inference_mode(), warnings.catch_warnings(), contextlib.redirect_stdout(chatter):
            warnings.simplefilter("ignore")
            torch.onnx.export(module.eval(), example, str(partial), dynamo=True, dynamic_shapes=shapes,
                              input_names=inputs, output_names=outputs, external_data=False, verbose=False)
    except Exception as e:
        partial.unlink(missing_ok=True)
        raise OnnxUnavailable(f"could not export the {kind} SNAC decoder to ONNX: {type(e).__name__}: {e}") from e
    finally:
        logging.disable(logging.NOTSET)
    partial.replace(path)  # atomic: a reader never sees half a graph


def exported(model: StreamingSnac, kind: str, cache_dir: str | Path) -> Path:
    """The cached graph ``kind`` of ``model``, exported first if it is not there yet. Processes that
    share ``cache_dir`` export a graph once: the others wait for it (a lock file beside it)."""
    path = Path(cache_dir) / f"snac-{kind}-{graph_key(model, kind)}.onnx"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes, or its process dies)
        if not path.is_file():  # (or another process exported it while this one waited)
            log.info("exporting the %s SNAC decoder to %s (once per codec and torch version) ...", kind, path)
            t0 = time.perf_counter()
            export(model, kind, path)
            log.info("exported in %.1f s", time.perf_counter() - t0)
    return path


def _numpy(values: list[Any]) -> list[Any]:
    return [v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v for v in values]


class _Runner:
    """Runs graph ``kind`` of ``model`` (exported first if need be); called like the torch module
    (tensors in, numpy out). Subclasses open the graph (``_open``) and run it (``_run``)."""

    runtime = ""

    def __init__(self, model: StreamingSnac, cache_dir: str | Path, kind: str = "stream", threads: int = 0):
        if (reason := available(self.runtime)) is not None:
            raise OnnxUnavailable(reason)
        self.path = exported(model, kind, cache_dir)
        self._open(threads or os.cpu_count() or 1)

    def _open(self, threads: int) -> None:
        raise NotImplementedError

    def _run(self, values: list[Any]) -> list[np.ndarray]:
        raise NotImplementedError

    def __call__(self, *args) -> Any:
        audio, *states = self._run(_numpy(_flat(args)))
        return (audio, states) if states else audio


class OnnxRunner(_Runner):
    """ONNX Runtime, without spin-waiting between calls."""

    runtime = "onnxruntime"

    def _open(self, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def _run(self, values: list[Any]) -> list[np.ndarray]:
        return self.session.run(None, dict(zip(self.inputs, values, strict=True)))


class OpenVinoRunner(_Runner):
    """OpenVINO's CPU plugin in float32 (the plugin computes integers in 32 bits: stream positions
    stay far below that). It compiles kernels for each new input shape on first use, which stalls
    that call (README)."""

    runtime = "openvino"

    def _open(self, threads: int) -> None:
        import openvino as ov

        core = ov.Core()
        settings = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
        self.compiled = core.compile_model(core.read_model(str(self.path)), "CPU", settings)
        self.request = self.compiled.create_infer_request()

    def _run(self, values: list[Any]) -> list[np.ndarray]:
        results = self.request.infer(values)
        # copies: the request reuses its output buffers on the next call
        return [np.array(results[out], copy=True) for out in self.compiled.outputs]


def _flat(args: tuple) -> list[Any]:
    """The graph's inputs in order: tensors as given, the noise and state lists spread out."""
    out: list[Any] = []
    for a in args:
        out.extend(a if isinstance(a, (list, tuple)) else [a])
    return out


RUNNERS = {"onnxruntime": OnnxRunner, "openvino": OpenVinoRunner}
