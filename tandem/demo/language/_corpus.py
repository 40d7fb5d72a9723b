"""The text the language models learn from, its held-out split, and the tokenizer.

The text is ``pydoc_data.topics``: the Python language reference's topics
(about 465K characters), which ships with every CPython, so nothing is
downloaded. Documents (topics) are split whole: a held-out document never
lends a sentence to training, so held-out figures measure generalisation to
unseen text, not recall.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "TextSplits",
    "corpus_digest",
    "load_text_splits",
    "save_tokenizer",
    "train_tokenizer",
]

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
_SPECIAL = (PAD, BOS, EOS)  # ids 0, 1, 2


@dataclass(frozen=True)
class TextSplits:
    """Documents by name: ``train`` to learn from, ``heldout`` never seen in training."""

    train: dict[str, str]
    heldout: dict[str, str]

    @property
    def sizes(self) -> dict[str, int]:
        return {
            "train_documents": len(self.train),
            "heldout_documents": len(self.heldout),
            "train_chars": sum(map(len, self.train.values())),
            "heldout_chars": sum(map(len, self.heldout.values())),
        }


def _documents() -> dict[str, str]:
    from pydoc_data.topics import topics

    return {name: topics[name] for name in sorted(topics)}


def corpus_digest() -> str:
    """SHA-256 of the corpus as this Python ships it (it differs between Python releases)."""
    digest = hashlib.sha256()
    for name, text in _documents().items():
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()


def load_text_splits(*, heldout_fraction: float, seed: int) -> TextSplits:
    """Split the topics by document: shuffled by a keyed hash, then held out until the fraction.

    The largest documents are kept in training (a single 60K-character topic
    would otherwise make the held-out share jump), and at least one document
    is held out.
    """
    if not 0.0 < heldout_fraction < 0.5:
        raise ValueError(f"heldout_fraction {heldout_fraction} must be in (0, 0.5)")
    docs = _documents()
    total = sum(map(len, docs.values()))
    order = sorted(docs, key=lambda n: hashlib.sha256(f"{seed}:{n}".encode()).hexdigest())
    heldout: dict[str, str] = {}
    held = 0
    for name in order:
        if held >= heldout_fraction * total:
            break
        if len(docs[name]) > heldout_fraction * total / 2:
            continue
        heldout[name] = docs[name]
        held += len(docs[name])
    train = {n: t for n, t in docs.items() if n not in heldout}
    return TextSplits(train=train, heldout=dict(sorted(heldout.items())))


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE (GPT-2 style) trained on ``texts``: every string encodes, none is lost."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(_SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, directory: Path, *, context: int) -> None:
    """Write ``tokenizer.json`` and its config as Hugging Face and ONNX Runtime GenAI read them."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=context,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(directory))
