"""The SFT data of the training-parity run (olmax.parity.training, `Setup(sft=True)`): synthetic
conversations tokenized by `olmax.data.chat_files.tokenize_chat` (what `olmax tokenize --chat
instruct` runs: the OLMo 3 Instruct template, AI2's label masks, AI2's file layout), then their ids
renumbered onto a vocabulary of VOCAB (EOS kept as the last id) so the tiny model's output layer stays
small: the renumbered parts keep the layout (`token_ids_part_N.npy` in the smallest unsigned dtype
OLMo-core picks for VOCAB, `labels_mask_part_N.npy`, `token_ids_part_N.csv.gz`), which both sides
read, OLMo-core with `label_mask_paths`. OLMo-core's attention within documents and its runs over
several ranks are olmax.parity.olmo_core's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = "red blue green gold grey pink black white".split()
# the answer to a word: what the model has to learn, within the conversation it reads
ANSWER = dict(zip(WORDS, "stone river cloud leaf ash rose coal snow".split()))


def conversations(n: int, seed: int = 0) -> list[dict]:
    """Chat rows: one or two user/assistant exchanges, the answer naming ANSWER[w] for each word w the
    user wrote. All but every fifth have a short system prompt (the others get the template's default
    one): ~51 tokens each, so an instance of 128 tokens packs two or three."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        messages = [{"role": "system", "content": "one word per colour"}] if i % 5 else []
        for _ in range(int(rng.integers(1, 3))):
            words = list(rng.choice(WORDS, size=int(rng.integers(1, 8))))
            messages.append({"role": "user", "content": " ".join(words)})
            messages.append({"role": "assistant", "content": " ".join(ANSWER[w] for w in words)})
        rows.append({"messages": messages})
    return rows


def write_chat_corpus(directory: Path, n: int, vocab: int, eos: int, shard_tokens: int = 8000) -> list[str]:
    """`n` conversations through `tokenize_chat` (dolma2, instruct), renumbered onto ids 0..vocab-1 with
    dolma2's EOS as `eos`; returns the token part paths (each with its mask part beside it)."""
    from olmax.data.chat_files import MASKS, METADATA, TOKENS, tokenize_chat
    from olmax.data.tokenizer import Dolma2Tokenizer

    raw = directory / "dolma2"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in conversations(n)))
    manifest = tokenize_chat([raw / "sft.jsonl"], raw / "tokens", "instruct", shard_tokens=shard_tokens)[""]
    info = Dolma2Tokenizer().info
    parts = [np.fromfile(raw / "tokens" / p["path"], dtype=manifest["dtype"]) for p in manifest["shards"]]
    used = np.unique(np.concatenate(parts))
    used = used[used != info.eos_token_id]
    if len(used) > vocab - 3:  # the ids of a tiny vocabulary leave the pad and EOS ids free
        raise ValueError(f"{len(used)} distinct tokens do not fit a vocabulary of {vocab}")
    new_id = dict(zip(used.tolist(), range(len(used))))
    new_id[info.eos_token_id] = eos
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32  # OLMo-core's smallest unsigned dtype
    out = directory / "tokens"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, ids in enumerate(parts):
        np.asarray([new_id[t] for t in ids.tolist()], dtype).tofile(out / TOKENS.format(k))
        for name in (MASKS.format(k), METADATA.format(k)):  # masks and document offsets are unchanged
            (out / name).write_bytes((raw / "tokens" / name).read_bytes())
        paths.append(str(out / TOKENS.format(k)))
    return paths
