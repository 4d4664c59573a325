"""The tests' SNAC: the 24 kHz SNAC's structure with fewer channels, seeded random weights.

Rates, strides, kernel sizes, codebooks, the local attention and the noise blocks are the 24 kHz
model's, so the hop (512 samples), the frame layout and the decoder's receptive field are too: all
that Lyre's codec code depends on. Only the channel widths are narrower (``NARROW``), which makes a
decode ~5x cheaper on CPU, and decoding is most of what a test that speaks costs. The shipped demo
checkpoint keeps the full width (``benchmark.py --mode codec`` measures its cost, ``lyre codec
prepare`` exports it); tests/codec/test_narrow.py holds the two to the same structure.

Written once under ``models/test-codec/`` (ignored by git, like every model artifact) and rewritten
when its configuration changes; servers and services in the tests get it as ``codec.path``."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
from pathlib import Path

import torch

from lyre.model import demo
from tests.support.paths import REPO_ROOT

NARROW = {"encoder_dim": 16, "decoder_dim": 256}  # the 24 kHz model's: 48 and 1024
CONFIG = {**demo.SNAC_24KHZ_CONFIG, **NARROW}
SEED = 0

_KEY = hashlib.sha256(json.dumps([CONFIG, SEED, torch.__version__], sort_keys=True).encode()).hexdigest()[:12]
CODEC_DIR = REPO_ROOT / "models" / "test-codec" / f"snac-{_KEY}"
_lock = threading.Lock()


def narrow_codec() -> Path:
    """The directory of the tests' SNAC (``config.json`` + ``pytorch_model.bin``), written first if
    it is not there yet."""
    with _lock:
        if not (CODEC_DIR / "pytorch_model.bin").is_file():
            _write(CODEC_DIR)
    return CODEC_DIR


def _write(out_dir: Path) -> None:
    from snac import SNAC

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".snac-", dir=out_dir.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            model = SNAC(**CONFIG)
        torch.save(model.state_dict(), tmp / "pytorch_model.bin")
        tmp.rename(out_dir)  # (another process that wrote it first wins: ours is thrown away)
    except OSError:
        if not (out_dir / "pytorch_model.bin").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
