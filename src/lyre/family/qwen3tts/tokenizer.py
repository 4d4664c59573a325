"""Qwen's text tokenizer as a Qwen3-TTS checkpoint publishes it: ``vocab.json`` + ``merges.txt``
(byte-level BPE) and ``tokenizer_config.json``'s ``added_tokens_decoder`` (the special tokens), or a
``tokenizer.json`` when there is one. Built with the ``tokenizers`` library: Qwen2's
pre-tokenizer split (single digits), NFC normalisation, byte-level bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lyre.errors import CheckpointError

# Qwen2's pre-tokenizer: contractions, letters, single digits, punctuation runs, newlines, spaces
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], added: dict[int, str]) -> Any:
    """A Qwen2-style ``tokenizers.Tokenizer`` of ``vocab`` and ``merges``, with ``added`` (id -> text)
    as special tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab, merges, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    for token_id, text in sorted(added.items()):
        tok.add_special_tokens([AddedToken(text, special=True, normalized=False)])
        if tok.token_to_id(text) != token_id:
            raise CheckpointError(f"special token {text!r} should have id {token_id}, the vocabulary puts it at "
                                  f"{tok.token_to_id(text)}")
    return tok


def load_text_tokenizer(model_dir: str | Path) -> Any:
    """The text tokenizer of a Qwen3-TTS checkpoint directory; CheckpointError naming a missing or
    unreadable file."""
    from tokenizers import Tokenizer

    model_dir = Path(model_dir)
    if (model_dir / "tokenizer.json").is_file():
        try:
            return Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise CheckpointError(f"{model_dir / 'tokenizer.json'} could not be read: {e}") from None
    missing = [n for n in ("vocab.json", "merges.txt", "tokenizer_config.json") if not (model_dir / n).is_file()]
    if missing:
        raise CheckpointError(f"{model_dir} has no text tokenizer: {', '.join(missing)} missing (and no tokenizer.json)")
    try:
        vocab = json.loads((model_dir / "vocab.json").read_text(encoding="utf-8"))
        lines = (model_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
        merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        added = {int(i): t["content"] for i, t in (config.get("added_tokens_decoder") or {}).items()}
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{model_dir}'s tokenizer files could not be read: {e}") from None
    bad = next((m for m in merges if len(m) != 2), None)
    if bad is not None:
        raise CheckpointError(f"{model_dir / 'merges.txt'}: {' '.join(bad)!r} is not a merge of two tokens")
    return byte_level_bpe(vocab, merges, added)
