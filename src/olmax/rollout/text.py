"""Text in, text out: `olmax generate`'s prompts and conversations, tokenised and continued with the
rollout sampler (olmax.rollout.sampler), greedy or sampled.

`generate_text` loads a checkpoint, encodes the prompts (with `chat`, renders each conversation with an
OLMo 3 chat template first) and decodes `batch_size` prompts at a time; EOS, and with `chat` the end of
a turn (`<|im_end|>`), stop a row on device.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

from olmax.rollout.sampler import Sampling, generate_in_batches


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
        params, cfg, encoded, max_new_tokens, batch_size, sampling=sampling, eos_ids=sorted(stops)
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
