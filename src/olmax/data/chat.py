"""Chat conversations -> token ids and label masks, as AI2 prepared OLMo 3's SFT data.

A conversation is a list of messages in the HF `messages` layout ({"role", "content"}, optionally
"functions" on system/user turns and "function_calls" on assistant turns), the layout of the
Dolci-*-SFT sets; a preference row holds two such lists, "chosen" and "rejected" (Dolci-*-DPO).

Rendering: the project's own OLMo 3 templates (chat_templates/*.jinja, docs/post-training/chat-data.md) in a
Jinja environment with the options transformers' `apply_chat_template` sets (trim_blocks, lstrip_blocks,
loopcontrols), so the text is the one transformers renders from the same template; the text is then
encoded with added tokens allowed, as a HF tokenizer does.

Label mask: open-instruct's `sft_tulu_tokenize_and_truncate_v1` (open_instruct/dataset_transformation.py),
the function AI2's `scripts/data/convert_sft_data_for_olmocore.py` ran. For every message that is not the
assistant's, the conversation is rendered up to that message and up to and including it (with the
generation prompt when an assistant turn follows); the tokens between the two lengths are masked. So
everything but assistant content is masked, the `<|im_start|>assistant\n` header included, and a
`<think>` that the generation prompt ends with is masked too (AI2's known quirk, kept for parity).
Because a prefix that ends with an assistant turn renders that turn's end as EOS, the first token after
an intermediate assistant turn (`<|im_end|>`) stays trainable, as in AI2's files.

Speed: the rule encodes a prefix per non-assistant message, each as long as the conversation so far.
With dolma2 (tiktoken), which encodes an added token by itself and the text between added tokens
apart, a text's ids are those of its pieces between the ChatML markers and EOS joined by the markers'
ids; `_Pieces` encodes each distinct piece of a conversation once, so the prefixes cost a render and
dictionary look-ups, and the ids and mask are the rule's. A tokenizer.json tokenizer (whose added
tokens may strip the whitespace around them) encodes every prefix whole.

Length: a conversation longer than `max_seq_len` tokens is truncated to its first `max_seq_len` tokens
(AI2 passed `truncation=True, max_length` to every render); one that keeps no trainable token is dropped
(open-instruct's `sft_tulu_filter_v1`). Both are counted by the caller.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Optional

import numpy as np

from olmax.config.data import CHAT_TEMPLATES
from olmax.data.tokenizer import DOLMA2_ADDED_TOKENS, Dolma2Tokenizer, Encoder

TEMPLATES = {name: f"olmo3_{name}.jinja" for name in CHAT_TEMPLATES}  # name -> file under chat_templates/
ROLES = ("system", "user", "assistant", "environment", "tool")
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")


class ChatError(ValueError):
    """A conversation or tokenizer that cannot be rendered; the message says which field is wrong."""


class ChatSkip(Exception):
    """A conversation left out of the output and counted under `reason` (AI2 drops these too)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ChatExample:
    ids: np.ndarray  # the tokenizer's dtype
    mask: np.ndarray  # bool, True where the token is trained on (AI2's label != -100)
    truncated: bool


def template_text(name: str) -> str:
    """The Jinja source of template `name` (a key of TEMPLATES)."""
    if name not in TEMPLATES:
        raise ChatError(f"unknown chat template {name!r} (expected one of {', '.join(TEMPLATES)})")
    return resources.files("olmax.data").joinpath("chat_templates", TEMPLATES[name]).read_text()


@functools.lru_cache(maxsize=None)
def _compiled(name: str):
    # The options of the environment transformers' chat_template_utils builds for apply_chat_template,
    # so a template written for a tokenizer_config.json renders the same text here as there. Not its
    # sandbox: that guards against untrusted templates, and these are olmax's own (TEMPLATES); it only
    # refuses unsafe calls, never changes the text, and costs a quarter to half of each render.
    from jinja2 import Environment
    from jinja2.ext import loopcontrols

    env = Environment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    return env.from_string(template_text(name))


@functools.lru_cache(maxsize=None)
def _globals(name: str) -> dict:
    return dict(_compiled(name).globals)


def render(name: str, messages: list[dict], eos_token: str, add_generation_prompt: bool = False) -> str:
    """The conversation as template `name` writes it."""
    template = _compiled(name)
    # What Template.render does (jinja2/environment.py, Jinja 3.1), but with the template's globals (a
    # ChainMap, which render copies into each new context) flattened once: about a third of a render
    variables = {"messages": messages, "add_generation_prompt": add_generation_prompt, "eos_token": eos_token}
    context = template.new_context({**_globals(name), **variables}, shared=True)
    return template.environment.concat(template.root_render_func(context))


def check_chat_tokenizer(tok: Encoder) -> str:
    """The EOS text of `tok`, after checking that it encodes each ChatML marker as one token."""
    for marker in CHAT_TOKENS:
        ids = tok.encode(marker)
        # one id that decodes back to the marker: not split into pieces, and not an unknown-token id
        if len(ids) != 1 or tok.decode(ids) != marker:
            raise ChatError(
                f"tokenizer {tok.info.name} has no {marker} token (it encodes to {tok.decode(ids)!r}): "
                "OLMo 3's chat templates need dolma2's <|im_start|> and <|im_end|>"
            )
    return tok.decode([tok.info.eos_token_id])


def check_messages(messages: Any, field: str = "messages") -> list[dict]:
    """`messages` if it is a conversation the templates can render; a ChatError naming the problem if not."""
    if not isinstance(messages, list) or not messages:
        raise ChatError(f"`{field}` is not a non-empty list of messages")
    for i, m in enumerate(messages):
        where = f"`{field}[{i}]`"
        if not isinstance(m, dict):
            raise ChatError(f"{where} is not an object")
        role = m.get("role")
        if role not in ROLES:
            raise ChatError(f"{where} has unknown role {role!r} (expected one of {', '.join(ROLES)})")
        content = m.get("content")
        # An assistant turn may carry only function calls; every other turn's text is concatenated.
        if not isinstance(content, str) and not (role == "assistant" and content is None):
            raise ChatError(f"{where} ({role}) has no string `content`")
        for key in ("functions", "function_calls"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise ChatError(f"{where} has a `{key}` that is not a string")
    return messages


class _Pieces:
    """dolma2's `encode` of chat text, piece by piece (module docstring, "Speed").

    tiktoken's encode (openai/tiktoken src/lib.rs, `CoreBPE`, tiktoken 0.14) finds the leftmost added
    token, encodes the text before it alone, emits the token's id and goes on after it; no dolma2 added
    token holds `<` past its first character, so none overlaps a ChatML marker or EOS, each of those in
    a text is found as itself, and `encode(text)` is the pieces' ids joined by the markers' ids
    (tests/data/test_data_chat.py checks this on texts built to break it)."""

    def __init__(self, tok: Dolma2Tokenizer, eos_token: str):
        # an EOS text that is no added token (a caller's choice) stays inside the pieces
        self.marker_ids = {m: DOLMA2_ADDED_TOKENS[m] for m in (*CHAT_TOKENS, eos_token) if m in DOLMA2_ADDED_TOKENS}
        self.split = re.compile("(" + "|".join(map(re.escape, self.marker_ids)) + ")").split
        # bounded: a piece can be a long message; the system prompt and the turn headers recur across rows
        self.piece = functools.lru_cache(maxsize=1024)(tok.encode)

    def encode(self, text: str) -> list[int]:
        parts = self.split(text)  # piece, marker, piece, ..., marker, piece
        ids = list(self.piece(parts[0]))
        for marker, piece in zip(parts[1::2], parts[2::2]):
            ids.append(self.marker_ids[marker])
            ids += self.piece(piece)
        return ids

    def length(self, text: str) -> int:
        parts = self.split(text)
        return len(parts) // 2 + sum(map(len, map(self.piece, parts[::2])))


@functools.lru_cache(maxsize=4)
def _pieces(tok: Dolma2Tokenizer, eos_token: str) -> _Pieces:
    return _Pieces(tok, eos_token)


def sft_example(
    name: str, messages: list[dict], tok: Encoder, eos_token: str, max_seq_len: Optional[int] = None
) -> ChatExample:
    """Token ids and label mask of one checked conversation (module docstring: mask, length)."""
    if not any(m["role"] == "assistant" for m in messages):
        raise ChatSkip("no_assistant_turn")

    if isinstance(tok, Dolma2Tokenizer):
        pieces = _pieces(tok, eos_token)
        encode, text_length = pieces.encode, pieces.length
    else:
        encode, text_length = tok.encode, lambda text: len(tok.encode(text))

    # by (prefix, generation prompt): after a non-assistant message that another one follows (system
    # then user), the second's start is the first's end, so its prefix is rendered once
    lengths: dict[tuple[int, bool], int] = {}

    def length(upto: int, generation: bool) -> int:
        if (upto, generation) not in lengths:
            lengths[upto, generation] = text_length(render(name, messages[:upto], eos_token, generation))
        return lengths[upto, generation]

    ids = encode(render(name, messages, eos_token))
    mask = np.ones(len(ids), dtype=np.bool_)
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            continue
        start = 0 if i == 0 else length(i, False)
        next_is_assistant = i + 1 < len(messages) and messages[i + 1]["role"] == "assistant"
        end = length(i + 1, next_is_assistant)
        mask[start:end] = False
        if max_seq_len is not None and end >= max_seq_len:
            break
    truncated = max_seq_len is not None and len(ids) > max_seq_len
    if truncated:
        ids, mask = ids[:max_seq_len], mask[:max_seq_len]
    if not mask.any():
        raise ChatSkip("truncated_to_no_trainable_tokens" if truncated else "no_trainable_tokens")
    return ChatExample(np.asarray(ids, dtype=tok.info.dtype), mask, truncated)


def preference_examples(
    name: str, row: dict, tok: Encoder, eos_token: str, max_seq_len: Optional[int] = None
) -> tuple[ChatExample, ChatExample]:
    """The chosen and the rejected conversation of a preference row, each as `sft_example` makes it."""
    chosen, rejected = check_messages(row.get("chosen"), "chosen"), check_messages(row.get("rejected"), "rejected")
    if chosen == rejected:
        raise ChatSkip("chosen_equals_rejected")
    return (
        sft_example(name, chosen, tok, eos_token, max_seq_len),
        sft_example(name, rejected, tok, eos_token, max_seq_len),
    )
