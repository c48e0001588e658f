"""Prompts for RL with verifiable rewards (trainer.objective=grpo), in the Dolci-*-RL layout.

A row is {"messages": [...], "ground_truth": ..., "dataset": "math" | "ifeval" | ...}: the conversation
so far, what the verifier checks the answer against, and the verifier's name (open-instruct's RL
datasets; its `rlvr_tokenize_v1` renders `messages` with the generation prompt). JSONL (.gz, .zst) or
Parquet, as `olmax tokenize --chat` reads them.

Each prompt is rendered with the chat template and its generation prompt (Think's ends with
`<think>`), tokenized, and kept as (ids, ground truth, verifier). Rows that cannot be trained on are
skipped and counted, never silently: no ground truth (`no_ground_truth`), longer than the prompt limit
(`too_long`; open-instruct drops these too, `rlvr_max_length_filter_v1`). A row that is not a
conversation or names no verifier is an error naming the file and row: the data is malformed, not
merely unusable. A ground truth that is not a string (a list of test cases, a constraint dict) is
kept as its JSON text, which is how open-instruct's datasets store them.
"""

from __future__ import annotations

import json
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
    ground_truth: str
    verifier: str  # the row's `dataset`
    source: str  # "file:row", for messages


@dataclass(frozen=True)
class PromptSet:
    prompts: tuple[Prompt, ...]
    skipped: dict  # reason -> count
    template: str

    def verifiers(self) -> set[str]:
        return {p.verifier for p in self.prompts}


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
            verifier = row.get("dataset")
            if not isinstance(verifier, str) or not verifier:
                raise TokenizeError(f'{where}: no `dataset` naming the row\'s verifier (e.g. "math")')
            truth = row.get("ground_truth")
            if truth is None or truth == "" or truth == []:
                skipped["no_ground_truth"] += 1
                continue
            ids = tok.encode(render(template, messages, eos, add_generation_prompt=True))
            if len(ids) > max_prompt_len:
                skipped["too_long"] += 1
                continue
            text = truth if isinstance(truth, str) else json.dumps(truth, sort_keys=True)
            prompts.append(Prompt(tuple(ids), text, verifier, where))
    if not prompts:
        raise TokenizeError(f"no trainable prompt in {', '.join(map(str, paths))} (skipped: {dict(skipped)})")
    return PromptSet(tuple(prompts), dict(skipped), template)
