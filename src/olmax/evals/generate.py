"""Text generation from an olmax checkpoint: batched, with the key/value cache of olmax.evals.decode,
greedy or sampled (`olmax generate`, and lm-eval's generate_until).

Each next token is chosen from the logits of the REAL vocabulary (a HF export has no padded rows):

- temperature 0: the argmax (greedy), as transformers' `generate(do_sample=False)`.
- temperature > 0: the logits are divided by the temperature, then top-k keeps the k largest and
  top-p the smallest set of most likely tokens whose probabilities reach p (always at least one),
  in that order, as transformers' logits processors do; the token is drawn from what remains.
  The draw for prompt i's t-th new token (t = 0, 1, ...) uses the key fold_in(fold_in(key(seed), t), i),
  where i is the prompt's position in the WHOLE request, not its row in a batch: the same seed, prompts
  and settings give the same text whatever the batch size, and copies of one prompt get their own draws.

Prompts are right-padded into one batch: a prefill at positions 0.., then one single-token pass per
new token. A row stops after `max_new_tokens`, at EOS (`eos_id`, kept in its output), or once
`stop(row, ids)` says so; the batch ends when every row has stopped. Prompt and cache lengths are
rounded up to powers of two, so a few shapes are compiled for many prompts; the prompts' positions in
the request are an argument, so a batch's offset compiles nothing new. `generate_in_batches` runs a
request of any length `batch_size` prompts at a time.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from olmax.config import ModelConfig
from olmax.evals.decode import cached_forward, init_cache


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen (module doc). temperature 0 is greedy; top_k 0 and top_p 1 are off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"sampling needs temperature >= 0, 0 < top_p <= 1 and top_k >= 0, got {self}")


def _bucket(n: int, minimum: int = 16) -> int:
    return max(minimum, 1 << (n - 1).bit_length())


def _choose(logits: jnp.ndarray, key: jnp.ndarray, rule: Optional[jnp.ndarray], index: jnp.ndarray) -> jnp.ndarray:
    """The next token of each row from float32 logits (B, V) over the real vocabulary. `rule` is None
    (greedy) or (temperature, top_k, top_p) as an array, so new settings need no recompilation; row r
    draws with fold_in(key, index[r]), index[r] being its prompt's position in the whole request."""
    if rule is None:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    temperature, top_k, top_p = rule[0], rule[1].astype(jnp.int32), rule[2]
    logits = logits / temperature
    ordered = jnp.sort(logits, axis=-1)[:, ::-1]
    kth = jnp.where(top_k > 0, ordered[:, jnp.maximum(top_k, 1) - 1], -jnp.inf)[:, None]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
    ordered = jnp.where(ordered < kth, -jnp.inf, ordered)
    probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more likely tokens
    kept = jnp.where((before < top_p) | (top_p >= 1), ordered, jnp.inf)  # the first is always kept
    logits = jnp.where(logits < jnp.min(kept, axis=-1, keepdims=True), -jnp.inf, logits)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
    return jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32)


@functools.lru_cache(maxsize=None)
def _compiled(cfg: ModelConfig, sample: bool):
    """Prefill and step functions, jitted once per config for greedy and once for sampling (the
    settings and the seed are arguments); the cache is donated (updated in place)."""

    def prefill(params, cache, tokens, lengths, key, rule, index):
        logits, cache = cached_forward(params, cache, tokens, jnp.zeros_like(lengths), cfg)
        last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0, : cfg.vocab_size]
        return _choose(last, jax.random.fold_in(key, 0), rule if sample else None, index), cache

    def step(params, cache, tokens, positions, key, rule, index, t):
        logits, cache = cached_forward(params, cache, tokens[:, None], positions, cfg)
        new = _choose(logits[:, 0, : cfg.vocab_size], jax.random.fold_in(key, t), rule if sample else None, index)
        return new, cache

    return jax.jit(prefill, donate_argnums=1), jax.jit(step, donate_argnums=1)


def generate(
    params: dict,
    cfg: ModelConfig,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    sampling: Sampling = Sampling(),
    eos_id: Optional[int] = None,
    stop: Optional[Callable[[int, list[int]], bool]] = None,
    index: Optional[Sequence[int]] = None,
) -> list[list[int]]:
    """The new tokens of each prompt (one batch); see the module doc. `index` holds each prompt's
    position in the whole request, which keys its random draws (default 0, 1, ...: the batch is the request)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    index = np.arange(len(prompts), dtype=np.int32) if index is None else np.asarray(index, np.int32)
    if index.shape != (len(prompts),):
        raise ValueError(f"index needs one position per prompt ({len(prompts)}), got shape {index.shape}")
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    width = _bucket(int(lengths.max()))
    tokens = np.zeros((len(prompts), width), np.int32)
    for r, p in enumerate(prompts):
        tokens[r, : len(p)] = p
    cache = init_cache(cfg, len(prompts), _bucket(width + max_new_tokens))
    prefill, step = _compiled(cfg, sampling.temperature > 0)
    key = jax.random.key(sampling.seed)
    rule = jnp.asarray([sampling.temperature or 1.0, sampling.top_k, sampling.top_p], jnp.float32)
    index = jnp.asarray(index)
    nxt, cache = prefill(params, cache, jnp.asarray(tokens), jnp.asarray(lengths), key, rule, index)
    out: list[list[int]] = [[] for _ in prompts]
    done = np.zeros(len(prompts), bool)
    for t in range(max_new_tokens):
        ids = np.asarray(nxt)
        for r in np.flatnonzero(~done):
            out[r].append(int(ids[r]))
            done[r] = (
                len(out[r]) >= max_new_tokens
                or (eos_id is not None and out[r][-1] == eos_id)
                or (stop is not None and stop(int(r), out[r]))
            )
        if done.all():
            break
        nxt, cache = step(params, cache, jnp.asarray(ids), jnp.asarray(lengths + t), key, rule, index, jnp.int32(t + 1))
    return out


def generate_in_batches(
    params: dict,
    cfg: ModelConfig,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    batch_size: int,
    *,
    sampling: Sampling = Sampling(),
    eos_id: Optional[int] = None,
    stop: Optional[Callable[[int, list[int]], bool]] = None,
) -> list[list[int]]:
    """The new tokens of each prompt, decoded `batch_size` prompts at a time; each prompt's draws are
    keyed by its position in `prompts`, so the result does not depend on `batch_size`. `stop` is
    `generate`'s, its row counted within the batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    out: list[list[int]] = []
    for first in range(0, len(prompts), batch_size):
        batch = prompts[first : first + batch_size]
        index = range(first, first + len(batch))
        out += generate(params, cfg, batch, max_new_tokens, sampling=sampling, eos_id=eos_id, stop=stop, index=index)
    return out


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
    batch_size: int = 8,
    step: Optional[int] = None,
    dtype: Optional[str] = None,
    chat: Optional[str] = None,
) -> dict:
    """Load a checkpoint and continue each prompt; the report lists prompt, text, ids and why each stopped.

    With `chat` ("instruct" or "think") each prompt is a conversation (a string is one user message),
    rendered with that OLMo 3 template and its generation prompt (olmax.data.chat, the text
    transformers' `apply_chat_template(..., add_generation_prompt=True)` gives on a `--chat` export);
    generation also stops at `<|im_end|>`, the end of a turn, and `text` is the reply alone."""
    from olmax.data import chat as chat_templates
    from olmax.data.tokenizer import load_tokenizer
    from olmax.evals.scoring import eval_mesh, load_checkpoint

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
    start = time.perf_counter()
    generated = generate_in_batches(
        params, cfg, encoded, max_new_tokens, batch_size, sampling=sampling, stop=lambda _, ids: ids[-1] in stops
    )
    results = []
    for n, (prompt, ids, new) in enumerate(zip(prompts, encoded, generated)):
        finished = "eos" if new[-1] in stops else "length"
        text = tok.decode(new[:-1] if finished == "eos" else new)
        row = {"prompt": prompt, "text": text, "prompt_ids": ids, "ids": new, "finish": finished}
        results.append(row if conversations is None else {"messages": conversations[n], **row})
    seconds = time.perf_counter() - start
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
        "new_tokens": sum(len(r["ids"]) for r in results),
    }
