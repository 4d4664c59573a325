"""The tests decode with a narrow SNAC (tests/support/narrow_codec.py) instead of the demo's full
width: it is fair only while the two have one structure, which is what Lyre's codec code depends
on. These tests hold it."""

from __future__ import annotations

import json

from lyre.codec.streaming import StreamingSnac
from lyre.model import checkpoint, demo, orpheus
from tests.support.narrow_codec import CONFIG, NARROW


def test_the_narrow_codec_differs_from_the_demos_in_its_widths_only(demo_dir, snac_dir):
    assert set(NARROW) == {"encoder_dim", "decoder_dim"}
    assert {k: v for k, v in CONFIG.items() if k not in NARROW} == \
        {k: v for k, v in demo.SNAC_24KHZ_CONFIG.items() if k not in NARROW}
    assert json.loads((snac_dir / "config.json").read_text()) == CONFIG


def test_its_streaming_decoder_has_the_demos_layers_lag_and_state_lengths(demo_dir, snac_dir):
    full_snac, narrow_snac = checkpoint.load_snac(demo_dir / "snac"), checkpoint.load_snac(snac_dir)
    assert narrow_snac.hop_length == full_snac.hop_length == orpheus.SAMPLES_PER_FRAME // 4
    full, narrow = StreamingSnac(full_snac), StreamingSnac(narrow_snac)
    assert narrow.lag == full.lag == 4757  # samples the exact audio trails the newest frame by
    assert narrow.pad_frames == full.pad_frames
    assert [type(m).__name__ for m in narrow.layers] == [type(m).__name__ for m in full.layers]
    assert [k for _, k in narrow.state_shapes] == [k for _, k in full.state_shapes]  # the context each layer keeps
    assert narrow.noise_per_frame == full.noise_per_frame
    assert narrow.state_bytes < full.state_bytes  # (only the channels are fewer)
