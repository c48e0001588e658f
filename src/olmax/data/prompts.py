"""Prompts for RL with verifiable rewards (trainer.objective=grpo), in the Dolci-*-RL layout.

A row is {"messages": [...], "ground_truth": ..., "dataset": "math" | "ifeval" | ...}: the conversation
so far, what the verifier checks the answer against, and the verifier's name (open-instruct's RL
datasets; its `rlvr_tokenize_v1` renders `messages` with the generation prompt). `dataset` and
`ground_truth` may also be two lists of one length, paired item by item (the Dolci-*-RL sets store
them so; olmax.rewards.verifiers.reward sums the pairs). JSONL (.gz, .zst) or Parquet, as `olmax tokenize --chat`
reads them.

Each prompt is rendered with the chat template and its generation prompt (Think's ends with
`<think>`), tokenized, and kept as (ids, ground truth, verifier). Rows that cannot be trained on are
skipped and counted, never silently: no ground truth (`no_ground_truth`), longer than the prompt limit
(`too_long`; open-instruct drops these too, `rlvr_max_length_filter_v1`). A row that is not a
conversation, names no verifier or pairs names and ground truths of different lengths is an error
naming the file and row: the data is malformed, not merely unusable.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from olmax.data.chat import ChatError, check_chat_tokenizer, check_messages, render
from olmax.data.chat_files import CHAT_SUFFIXES, chat_rows
from olmax.data.tokenize import TokenizeError
from olmax.data.tokenizer import load_tokenizer


@dataclass(frozen=True)
class Prompt:
    ids: tuple[int, ...]  # the rendered conversation with the generation prompt
    verifiers: tuple[str, ...]  # the row's `dataset`, as a tuple
    ground_truths: tuple  # the row's `ground_truth`, paired with `verifiers`
    source: str  # "file:row", for messages


@dataclass(frozen=True)
class PromptSet:
    prompts: tuple[Prompt, ...]
    skipped: dict  # reason -> count
    template: str

    def verifiers(self) -> set[str]:
        return {name for p in self.prompts for name in p.verifiers}


def read_prompts(
    paths: Sequence[str | Path], template: str, max_prompt_len: int, tokenizer: str = "dolma2"
) -> PromptSet:
    """The trainable prompts of `paths`, in file and row order (module doc)."""
    if not paths:
        raise TokenizeError("no prompt files given (data.paths)")
    tok = load_tokenizer(tokenizer)
    eos = check_chat_tokenizer(tok)
    prompts: list[Prompt] = []
    skipped: Counter = Counter()
    for path in map(Path, paths):
        if not path.is_file():
            raise TokenizeError(f"prompt file {path} does not exist")
        if not path.name.endswith(CHAT_SUFFIXES):
            raise TokenizeError(f"prompt file {path}: unsupported file type (expected {', '.join(CHAT_SUFFIXES)})")
        for n, row in chat_rows(path):
            where = f"{path}:{n}"
            if not isinstance(row, dict):
                raise TokenizeError(f"{where}: expected an object with messages, ground_truth and dataset")
            try:
                messages = check_messages(row.get("messages"), f"{where} messages")
            except ChatError as e:
                raise TokenizeError(str(e)) from None
            names = _as_tuple(row.get("dataset"))
            if not names or not all(isinstance(x, str) and x for x in names):
                raise TokenizeError(f"{where}: no `dataset` naming the row's verifier (e.g. 'math')")
            truths = _as_tuple(row.get("ground_truth"))
            if not truths or any(t is None or t == "" for t in truths):
                skipped["no_ground_truth"] += 1
                continue
            if len(truths) != len(names):
                raise TokenizeError(f"{where}: {len(names)} verifier names (`dataset`) but {len(truths)} ground truths")
            ids = tok.encode(render(template, messages, eos, add_generation_prompt=True))
            if len(ids) > max_prompt_len:
                skipped["too_long"] += 1
                continue
            prompts.append(Prompt(tuple(ids), names, truths, where))
    if not prompts:
        raise TokenizeError(f"no trainable prompt in {', '.join(map(str, paths))} (skipped: {dict(skipped)})")
    return PromptSet(tuple(prompts), dict(skipped), template)


def _as_tuple(value) -> tuple:
    """A row's `dataset` or `ground_truth`: one value, or a list paired item by item."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)
