"""Text in, text out: `olmax generate`'s prompts and conversations, tokenised and continued with the
rollout sampler (olmax.rollout.sampler), greedy or sampled.

`generate_text` loads a checkpoint, encodes the prompts (with `chat`, renders each conversation with an
OLMo 3 chat template first) and decodes them in one program (or `batch_size` prompts at a time); EOS,
and with `chat` the end of a turn (`<|im_end|>`), stop a row on device.

Stop strings on the decoded text (`stop_table`, `cut_at_stop`), as vLLM matches them
(vllm/v1/engine/detokenizer.py, check_stop_strings: on the incrementally detokenised text, the
sequence ending at the token that completes the string). A string that the model spells with other tokens (`7}</answer>`
is `7`, `}</`, `answer`, `>`; `</answer>` alone `</`, `answer`, `>`) still stops it, as one token-id
sequence would not. The check runs on device: the byte-level automaton of the strings (Aho-Corasick)
is lifted to the vocabulary once, a table of the next state for every state and token (-1 where a
string ends inside the token), so the decoding loop takes one lookup per token and no host round
trip. A token's text is the same wherever it stands (the tokenizer's `token_bytes`), and a stop string
is whole UTF-8 characters, so matching the bytes is matching the text.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from olmax.rollout.sampler import Sampling, generate_in_batches


def _byte_automaton(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(next state (states, 256), whether a state ends a string (states,)) of the Aho-Corasick
    automaton of `strings`' UTF-8 bytes; state 0 has matched nothing."""
    children: list[dict[int, int]] = [{}]
    ends = [False]
    for text in strings:
        node = 0
        for b in text.encode():
            if b not in children[node]:
                children[node][b] = len(children)
                children.append({})
                ends.append(False)
            node = children[node][b]
        ends[node] = True
    step = np.zeros((len(children), 256), np.int32)
    fallback = [0] * len(children)  # the longest proper suffix that is also a prefix
    queue = [0]
    for node in queue:  # breadth first: a node's fallback is shallower, so its row is complete
        for b in range(256):
            child = children[node].get(b)
            if child is None:
                step[node, b] = step[fallback[node], b] if node else 0
                continue
            step[node, b] = child
            fallback[child] = step[fallback[node], b] if node else 0
            ends[child] = ends[child] or ends[fallback[child]]
            queue.append(child)
    return step, np.asarray(ends)


def stop_table(tok, strings: Sequence[str]) -> np.ndarray:
    """The automaton of `strings` over `tok`'s vocabulary (module doc): (states, vocab) int32, the
    state after each token from each state, -1 where one of the strings ends within the token; state 0
    starts a response. olmax.rollout.sampler.sample's `stop_text`."""
    if not strings or any(not s for s in strings):
        raise ValueError(f"stop strings must be non-empty, got {list(strings)}")
    step, ends = _byte_automaton(strings)
    pieces = tok.token_bytes()
    lengths = np.asarray([len(p) for p in pieces])
    order = np.argsort(-lengths, kind="stable")  # longest first: the tokens still reading are a prefix
    width = int(lengths.max())
    data = np.frombuffer(b"".join(pieces[i].ljust(width, b"\0") for i in order), np.uint8).reshape(-1, width)
    state = np.repeat(np.arange(len(step), dtype=np.int32)[:, None], len(pieces), axis=1)
    ended = np.zeros(state.shape, bool)
    for j in range(width):
        k = int(np.sum(lengths > j))
        state[:, :k] = step[state[:, :k], data[:k, j]]
        ended[:, :k] |= ends[state[:, :k]]
    table = np.empty_like(state)
    table[:, order] = np.where(ended, -1, state)
    return table


def cut_at_stop(text: str, strings: Sequence[str]) -> str:
    """`text` up to the end of the first stop string in it (the earliest end), unchanged without one:
    the text vLLM returns with include_stop_str_in_output=True (vllm v1/engine/detokenizer.py,
    check_stop_strings), the string kept as a stop token sequence was here, and the rest of the token
    that completed it dropped (the newline of a `>` + newline token)."""
    ends = [text.find(s) + len(s) for s in strings if s in text]
    return text[: min(ends)] if ends else text


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a file: .jsonl with a "prompt" field per line, otherwise one prompt per line."""
    import json

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {path} does not exist")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if path.suffix != ".jsonl":
        return lines
    prompts = []
    for n, line in enumerate(lines, 1):
        try:
            prompts.append(str(json.loads(line)["prompt"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f'{path}:{n}: expected a JSON object with a "prompt" field') from None
    return prompts


def read_conversations(path: str | Path) -> list[list[dict]]:
    """Conversations for `olmax generate --chat`: a .json file holding one conversation (a list of
    {"role", "content"} messages) or a list of them; a .jsonl file with one per line, a list or an
    object with a "messages" list (the SFT rows' layout). Each is checked by olmax.data.chat.check_messages."""
    import json

    from olmax.data.chat import check_messages

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"messages file {path} does not exist")
    try:
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            rows = [r.get("messages") if isinstance(r, dict) else r for r in rows]
        else:
            rows = json.loads(path.read_text())
            rows = [rows] if isinstance(rows, list) and rows and isinstance(rows[0], dict) else rows
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a conversation or a list of conversations")
    return [check_messages(r, f"{path.name}[{n}]") for n, r in enumerate(rows)]


def generate_text(
    ckpt: str,
    prompts: Sequence[str] | Sequence[list[dict]],
    *,
    max_new_tokens: int = 64,
    sampling: Sampling = Sampling(),
    tokenizer: str = "dolma2",
    batch_size: int = 0,
    step: Optional[int] = None,
    dtype: Optional[str] = None,
    chat: Optional[str] = None,
) -> dict:
    """Load a checkpoint and continue each prompt; the report lists prompt, text, ids and why each stopped,
    and the time: `seconds` of generation (compiling included), `compile_seconds` of it spent tracing
    and compiling, and `tokens_per_second` of the rest. batch_size: prompts per program, 0 = all in one
    (one compile, the rows decoded side by side; smaller batches take as many sequential programs).

    With `chat` ("instruct" or "think") each prompt is a conversation (a string is one user message),
    rendered with that OLMo 3 template and its generation prompt (olmax.data.chat, the text
    transformers' `apply_chat_template(..., add_generation_prompt=True)` gives on a `--chat` export);
    generation also stops at `<|im_end|>`, the end of a turn, and `text` is the reply alone."""
    from olmax.checkpoint.inference import eval_mesh, load_checkpoint
    from olmax.data import chat as chat_templates
    from olmax.data.tokenizer import load_tokenizer

    if not prompts:
        raise ValueError("no prompts given")
    tok = load_tokenizer(tokenizer)
    eos = tok.info.eos_token_id
    stops = {eos}
    conversations = None
    if chat is not None:
        eos_text = chat_templates.check_chat_tokenizer(tok)
        stops.add(tok.encode("<|im_end|>")[0])
        conversations = [[{"role": "user", "content": p}] if isinstance(p, str) else p for p in prompts]
        prompts = [chat_templates.render(chat, c, eos_text, add_generation_prompt=True) for c in conversations]
    params, cfg, meta = load_checkpoint(ckpt, eval_mesh(), step=step, compute_dtype=dtype)
    encoded = [tok.encode(p) for p in prompts]
    for p, ids in zip(prompts, encoded):
        if not ids:
            raise ValueError(f"prompt {p!r} has no tokens")
        if len(ids) + max_new_tokens > cfg.max_position:
            raise ValueError(
                f"prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the model's "
                f"max_position {cfg.max_position}"
            )
    start, compiled = time.perf_counter(), _compile_seconds()
    generated = generate_in_batches(
        params, cfg, encoded, max_new_tokens, batch_size or len(encoded), sampling=sampling, eos_ids=sorted(stops)
    )
    results = []
    for n, (prompt, ids, new) in enumerate(zip(prompts, encoded, generated)):
        finished = "eos" if new[-1] in stops else "length"
        text = tok.decode(new[:-1] if finished == "eos" else new)
        row = {"prompt": prompt, "text": text, "prompt_ids": ids, "ids": new, "finish": finished}
        results.append(row if conversations is None else {"messages": conversations[n], **row})
    seconds, compiling = time.perf_counter() - start, _compile_seconds() - compiled
    new_tokens = sum(len(r["ids"]) for r in results)
    return {
        "ckpt": str(ckpt),
        "step": meta["step"],
        "tokenizer": tokenizer,
        "chat": chat,
        "max_new_tokens": max_new_tokens,
        "sampling": {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "seed": sampling.seed,
        },
        "results": results,
        "seconds": round(seconds, 2),
        "compile_seconds": round(compiling, 2),
        "new_tokens": new_tokens,
        "tokens_per_second": round(new_tokens / max(seconds - compiling, 1e-9)),
    }


_COMPILE_EVENTS = (  # jax/_src/dispatch.py (jax 0.10.2): a jit's tracing, lowering and XLA compile
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_compiling = [0.0]


@functools.cache
def _listen() -> None:
    import jax

    def add(event: str, seconds: float, **_) -> None:
        if event in _COMPILE_EVENTS:
            _compiling[0] += seconds

    jax.monitoring.register_event_duration_secs_listener(add)


def _compile_seconds() -> float:
    """Seconds this process has spent tracing and compiling jitted programs so far."""
    _listen()
    return _compiling[0]
