"""The Qwen3-TTS-Tokenizer-12Hz decoder (16 codebooks of 2048 codes per 80 ms frame -> 24 kHz audio,
1920 samples per frame), decoded exactly as it streams (issue 31).

The decoder is strictly causal with no lookahead: every convolution pads on the left only, the
transposed convolutions trim on the right, and its transformer attends to the current frame and
the 71 before it. So a stream carries, per session, each convolution's last inputs, each
overlapping transposed convolution's last input frame, and each transformer layer's last 71
keys and values, and decoding frame by frame gives what one decode of the whole sequence gives
(:mod:`lyre.codec.qwen12hz.decoder`; held to QwenLM's reference decoder by ``tests/qwen``).

The reference's own ``decode()`` is a full decode only up to 300 frames (24 s): past that it
decodes 300-frame chunks with 25 frames of left context. The exactness reference here is the full
causal decode.

- :mod:`lyre.codec.qwen12hz.config`: the decoder's shape, read from the checkpoint's config;
- :mod:`lyre.codec.qwen12hz.layers`: the streaming convolutions and activations;
- :mod:`lyre.codec.qwen12hz.transformer`: the sliding-window transformer with its carried K/V;
- :mod:`lyre.codec.qwen12hz.decoder`: the decoder, its weights and its stream state;
- :mod:`lyre.codec.qwen12hz.load`: the decoder of a checkpoint's ``speech_tokenizer/``.
"""

from lyre.codec.qwen12hz.config import DecoderConfig
from lyre.codec.qwen12hz.decoder import Decoder, StreamState
from lyre.codec.qwen12hz.load import load_decoder

__all__ = ["Decoder", "DecoderConfig", "StreamState", "load_decoder"]
