"""``codec.runtime: onnxruntime``: the streaming decoder exported to ONNX and run by ONNX Runtime.

The graph is :class:`~lyre.codec.streaming.StreamingSnac` exported once by ``torch.onnx.export``
(the same function, dynamic batch and chunk length) and cached on disk under a name derived from
its weights, so a restart loads it in a second; it is re-exported whenever the weights, the noise
setting, torch or Lyre's graph change. ONNX Runtime runs it with ``intra_op_num_threads`` equal to
torch's thread count and without spin-waiting, so it does not take the cores from the token engine
between calls. A test checks its audio against torch's.
"""

from __future__ import annotations

import contextlib
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

from lyre.codec.streaming import StreamingSnac

log = logging.getLogger("lyre.codec")

GRAPH_VERSION = 1  # bump when StreamingSnac's computation changes


class OnnxUnavailable(RuntimeError):
    """ONNX Runtime (or the exporter's packages) cannot be used here."""


def available() -> str | None:
    """None when the onnxruntime runtime can be used, else why not."""
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        return f"{e.name} is not installed (pip install onnxruntime onnxscript)"
    return None


def _names(model: StreamingSnac) -> tuple[list[str], list[str]]:
    noise = [f"noise_{i}" for i in range(len(model.noise_per_frame))]
    states = [f"state_{i}" for i in range(len(model.state_shapes))]
    return ["c0", "c1", "c2", "fed", "end", *noise, *states], ["audio", *[f"new_{s}" for s in states]]


def graph_key(model: StreamingSnac) -> str:
    """Hash of what the graph computes: the weights, the layer layout, torch's version, the graph version."""
    h = hashlib.sha256(f"{GRAPH_VERSION}:{torch.__version__}:{model.noise_per_frame}:{model.state_shapes}".encode())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def export(model: StreamingSnac, path: Path) -> None:
    """Write ``model`` as an ONNX graph with dynamic batch and chunk length (~20 s on 2 CPU cores)."""
    b, c = 2, 2
    example = (
        torch.zeros(b, c, dtype=torch.long), torch.zeros(b, 2 * c, dtype=torch.long),
        torch.zeros(b, 4 * c, dtype=torch.long), torch.zeros(b, dtype=torch.long),
        torch.full((b,), StreamingSnac.OPEN, dtype=torch.long),
        [torch.zeros(b, 1, c * p) for p in model.noise_per_frame],
        [torch.zeros(b, ch, k) for ch, k in model.state_shapes],
    )
    batch, chunk = torch.export.Dim("batch", min=1, max=4096), torch.export.Dim("chunk", min=1, max=1024)
    shapes = (
        {0: batch, 1: chunk}, {0: batch, 1: 2 * chunk}, {0: batch, 1: 4 * chunk}, {0: batch}, {0: batch},
        [{0: batch, 2: p * chunk} for p in model.noise_per_frame],
        [{0: batch} for _ in model.state_shapes],
    )
    inputs, outputs = _names(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".partial-{os.getpid()}")
    chatter = io.StringIO()  # the exporter prints its progress and logs every optimisation pass
    logging.disable(logging.WARNING)  # (at start-up, before any engine thread logs)
    try:
        with torch.inference_mode(), warnings.catch_warnings(), contextlib.redirect_stdout(chatter):
            warnings.simplefilter("ignore")
            torch.onnx.export(model.eval(), example, str(partial), dynamo=True, dynamic_shapes=shapes,
                              input_names=inputs, output_names=outputs, external_data=False, verbose=False)
    except Exception as e:
        partial.unlink(missing_ok=True)
        raise OnnxUnavailable(f"could not export the streaming decoder to ONNX: {type(e).__name__}: {e}") from e
    finally:
        logging.disable(logging.NOTSET)
    partial.replace(path)  # atomic: a reader never sees half a graph


class OnnxRunner:
    """Runs the exported graph; called like the torch module (tensors in, numpy audio and states out)."""

    def __init__(self, model: StreamingSnac, cache_dir: str | Path, threads: int | None = None):
        reason = available()
        if reason is not None:
            raise OnnxUnavailable(reason)
        import onnxruntime as ort

        self.path = Path(cache_dir) / f"snac-stream-{graph_key(model)}.onnx"
        if not self.path.is_file():
            log.info("exporting the streaming SNAC decoder to %s (once per codec and torch version) ...", self.path)
            t0 = time.perf_counter()
            export(model, self.path)
            log.info("exported in %.1f s", time.perf_counter() - t0)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        self.inputs, _ = _names(model)

    def __call__(self, c0, c1, c2, fed, end, noise, states) -> tuple[np.ndarray, list[np.ndarray]]:
        values: list[Any] = [c0, c1, c2, fed, end, *noise, *states]
        feed = {name: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v
                for name, v in zip(self.inputs, values, strict=True)}
        audio, *new_states = self.session.run(None, feed)
        return audio, new_states
