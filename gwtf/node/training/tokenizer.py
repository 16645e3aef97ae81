"""A run's tokenizer in the Hugging Face ``tokenizers`` format (``tokenizer.json``): a sponsor's
file (GPT-2's BPE, a Llama tokenizer, ...), a byte-level BPE trained on the corpus, or the byte
tokenizer (ids = UTF-8 bytes, vocabulary 256) written in that format, so every prepared data set
and every export carries a file that ``transformers`` loads.

The tokenizer's hash is the SHA-256 of its ``tokenizer.json`` bytes as the data set holds them;
the data set's manifest records it, so the run's data set hash commits to the tokenizer too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gwtf.errors import ConfigError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

#: The end-of-document token a trained tokenizer gets (id 0), GPT-2's spelling.
END_OF_TEXT = "<|endoftext|>"
#: End-of-document tokens looked for in a sponsor's tokenizer, in this order.
EOD_CANDIDATES = (END_OF_TEXT, "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")
#: The byte tokenizer separates documents with the NUL byte, which text does not contain.
BYTE_EOD_ID = 0
#: A tokenizer.json larger than this is not a tokenizer (Llama 3's is ~9 MB).
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class RunTokenizer:
    """A loaded tokenizer, its file's bytes, and the id that ends each document."""

    json_text: str
    eod_id: int
    kind: str  # "bytes" | "file" | "trained"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.json_text.encode("utf-8")).hexdigest()

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary: the highest id plus one (a tokenizer's ids may skip some,
        and the embedding must hold every id it gives)."""
        cached = self.__dict__.get("_vocab")
        if cached is None:
            ids = self._tokenizer().get_vocab(with_added_tokens=True).values()
            cached = max(ids, default=-1) + 1
            object.__setattr__(self, "_vocab", cached)
        return int(cached)

    def check(self) -> None:
        """Load the file (a ``ValueError`` if it is not a tokenizer) and check its
        end-of-document id."""
        if not 0 <= self.eod_id < self.vocab_size:
            raise ValueError(f"end-of-document id {self.eod_id} outside the vocabulary")

    @property
    def eod_token(self) -> str:
        token = self._tokenizer().id_to_token(self.eod_id)
        return str(token)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's token ids (int64), no special tokens added."""
        if self.kind == "bytes":  # ids are the UTF-8 bytes: no need to go through the library
            return [
                np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) for t in texts
            ]
        encodings = self._tokenizer().encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer().decode(list(ids), skip_special_tokens=False))

    def _tokenizer(self) -> Tokenizer:
        cached = self.__dict__.get("_loaded")
        if cached is None:
            from tokenizers import Tokenizer

            try:
                cached = Tokenizer.from_str(self.json_text)  # loaded once per object
            except Exception as exc:  # the library raises a bare Exception on a bad file
                raise ValueError(" ".join(str(exc).split())) from None
            object.__setattr__(self, "_loaded", cached)
        return cached


def byte_tokenizer() -> RunTokenizer:
    """Ids = UTF-8 bytes (vocabulary 256) as a ``tokenizers`` byte-level BPE without merges:
    the model's ids are unchanged and ``transformers`` loads it like any other."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = _byte_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return RunTokenizer(tokenizer.to_str(), BYTE_EOD_ID, "bytes")


def load_tokenizer(path: Path, eod_token: str | None = None) -> RunTokenizer:
    """A sponsor's ``tokenizer.json``; its end-of-document token is ``eod_token`` or the first
    of ``EOD_CANDIDATES`` it has."""
    from tokenizers import Tokenizer

    if not path.is_file():
        raise ConfigError(f"tokenizer file {path} does not exist; give a tokenizer.json")
    if path.stat().st_size > MAX_TOKENIZER_BYTES:
        raise ConfigError(f"tokenizer file {path} is over {MAX_TOKENIZER_BYTES} bytes")
    text = path.read_text(encoding="utf-8")
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # the library raises a bare Exception on a bad file
        reason = " ".join(str(exc).split())
        raise ConfigError(
            f"{path} is not a Hugging Face tokenizer.json ({reason}); give one"
        ) from None
    names = (eod_token,) if eod_token else EOD_CANDIDATES
    for name in names:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return RunTokenizer(text, int(token_id), "file")
    raise ConfigError(
        f"{path} has no end-of-document token {' or '.join(names)}; name one with --eod-token"
    )


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> RunTokenizer:
    """A byte-level BPE of ``vocab_size`` tokens trained on ``texts``; ``END_OF_TEXT`` is id 0.
    The same texts in the same order give the same file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not 256 + 1 <= vocab_size <= 2**32:
        raise ConfigError(f"--train-tokenizer {vocab_size}: a vocabulary of 257 or more tokens")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    eod = tokenizer.token_to_id(END_OF_TEXT)
    assert eod is not None  # a special token of the trainer
    return RunTokenizer(tokenizer.to_str(), int(eod), "trained")


def tokenizer_config(tokenizer: RunTokenizer, max_length: int) -> dict[str, object]:
    """``tokenizer_config.json`` for ``transformers``: ``PreTrainedTokenizerFast`` over the
    ``tokenizer.json`` beside it (a class every 4.x and 5.x release loads)."""
    eod = tokenizer.eod_token
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eod,
        "eos_token": eod,
        "unk_token": None,
        "pad_token": None,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte value, the alphabet ``ByteLevel`` maps bytes to:
    printable Latin-1 bytes stand for themselves, the others for code points from 256 up."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]
