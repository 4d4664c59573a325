"""The demo checkpoint's tokenizer: a Llama-3-style byte-level BPE trained on a few sentences, with
Orpheus's special tokens at Orpheus's ids (:func:`build_demo_tokenizer`)."""

from __future__ import annotations

import json
from typing import Any

from lyre.model import orpheus

# Text the demo tokenizer's byte-level BPE is trained on (merges only; any text still encodes).
CORPUS = [
    "Hello world, this is Lyre speaking.",
    "Thanks for calling, how can I help you today?",
    "Please hold while I transfer your call to the next available agent.",
    "Your appointment is confirmed for Tuesday at three thirty in the afternoon.",
    "I'm sorry, I didn't quite catch that. Could you say it again?",
    "The quick brown fox jumps over the lazy dog.",
    "She sells sea shells by the sea shore, and the shells she sells are surely seashells.",
    "It was a bright cold day in April, and the clocks were striking thirteen.",
    "Well, <laugh> that is the funniest thing I have heard all week.",
    "Oh no <sigh> the train is late again, so we'll have to wait.",
    "Can you believe it? <gasp> We actually won the game!",
    "Let me check your account balance: it is one hundred and twenty dollars.",
    "The meeting has been moved to Friday, the twenty-first of November.",
    "Numbers like 42, 1999 and 3.14 should be read clearly.",
    "Good morning! The weather today is sunny with a light breeze from the west.",
    "We're open from nine a.m. to five p.m., Monday through Friday.",
    "Turn left at the next intersection, then continue for two hundred meters.",
    "Would you like to hear the menu again, or speak to someone directly?",
]
CORPUS += [f"{voice}: {line}" for voice in orpheus.VOICES for line in CORPUS[:4]]

# Llama 3's pre-tokenizer split: contractions, letters, 1-3 digit groups, punctuation, spaces.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _special_token_names() -> list[str]:
    """Names of ids 128000..156939, as in Llama 3 + Orpheus."""
    names: dict[int, str] = {
        128000: "<|begin_of_text|>",
        128001: "<|end_of_text|>",
        128004: "<|finetune_right_pad_id|>",
        128006: "<|start_header_id|>",
        128007: "<|end_header_id|>",
        128008: "<|eom_id|>",
        128009: "<|eot_id|>",
        128010: "<|python_tag|>",
    }
    reserved = 0
    out = []
    for i in range(orpheus.TEXT_VOCAB_END, orpheus.CUSTOM_TOKEN_BASE):
        if i not in names:
            names[i] = f"<|reserved_special_token_{reserved}|>"
            reserved += 1
        out.append(names[i])
    out += [f"<custom_token_{i}>" for i in range(orpheus.VOCAB_SIZE - orpheus.CUSTOM_TOKEN_BASE)]
    return out


def build_demo_tokenizer(text_vocab: int = 2048) -> Any:
    """A Llama-3-style byte-level BPE ``tokenizers.Tokenizer`` with Orpheus's special ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=text_vocab,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)

    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    # Pad the model vocabulary to exactly 128000 entries so the added tokens land at Orpheus's ids.
    # The fillers are never produced: no merge leads to them.
    for i in range(len(vocab), orpheus.TEXT_VOCAB_END):
        vocab[f"<|lyre_demo_unused_{i}|>"] = i
    spec["added_tokens"] = [
        {
            "id": orpheus.TEXT_VOCAB_END + i,
            "content": name,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, name in enumerate(_special_token_names())
    ]
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", orpheus.BOS)],
    )
    assert tok.token_to_id("<custom_token_10>") == orpheus.AUDIO_TOKEN_OFFSET
    assert tok.get_vocab_size() == orpheus.VOCAB_SIZE
    return tok
