"""`olmax generate` (text from a checkpoint) and `olmax lm-eval` (lm-eval's own command line with the
`olmax` model registered)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from olmax.cli.common import (
    CkptOpt,
    DtypeOpt,
    JsonOpt,
    StepOpt,
    TokenizerOpt,
    app,
    batch_option,
    eval_errors,
    exits_on,
    runs_on,
    write_json,
)


@app.command("generate")
@runs_on("accelerator")
@exits_on("generate error", eval_errors)
def generate_cmd(
    ckpt: str = CkptOpt,
    prompt: Optional[list[str]] = typer.Option(None, "--prompt", help="prompt text; repeatable"),
    prompts: Optional[Path] = typer.Option(
        None, "--prompts", help='file: one prompt per line, or .jsonl with a "prompt" field'
    ),
    chat: Optional[str] = typer.Option(
        None,
        "--chat",
        help="render each prompt as a conversation with this OLMo 3 chat template (instruct or think) and "
        "its generation prompt; a plain prompt is one user message; prints the reply only",
    ),
    messages: Optional[Path] = typer.Option(
        None,
        "--messages",
        help='with --chat: .json file of a conversation ([{"role", "content"}, ...]) or a list of them, '
        'or .jsonl with one per line (a list, or {"messages": [...]})',
    ),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="tokens generated per prompt, at most"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy"),
    top_p: float = typer.Option(1.0, "--top-p", help="nucleus sampling mass (1 = off)"),
    top_k: int = typer.Option(0, "--top-k", help="sample among the k most likely tokens (0 = off)"),
    seed: int = typer.Option(0, "--seed", help="seed of the sampling (temperature > 0)"),
    tokenizer: str = TokenizerOpt,
    batch: int = batch_option(0),
    step: Optional[int] = StepOpt,
    dtype: Optional[str] = DtypeOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Continue prompts with the KV cache: greedy (temperature 0) or sampled with top-k / top-p;
    with --chat, answer conversations as a chat model (stops at <|im_end|> or EOS). --batch 0 (the
    default) decodes every prompt in one program; --json's report has the time and its compiling."""
    from olmax.data.chat import TEMPLATES
    from olmax.rollout.sampler import Sampling
    from olmax.rollout.text import generate_text, read_conversations, read_prompts

    if sum(x is not None for x in (prompt, prompts, messages)) != 1:
        raise typer.BadParameter("give --prompt (repeatable), --prompts FILE or --messages FILE")
    if chat is not None and chat not in TEMPLATES:
        raise typer.BadParameter(f"--chat must be one of {', '.join(TEMPLATES)}, got {chat!r}")
    if messages is not None and chat is None:
        raise typer.BadParameter("--messages needs --chat instruct|think (the template that renders them)")
    texts = list(prompt) if prompt else read_prompts(prompts) if prompts else read_conversations(messages)
    report = generate_text(
        ckpt,
        texts,
        max_new_tokens=max_new_tokens,
        tokenizer=tokenizer,
        batch_size=batch,
        sampling=Sampling(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed),
        step=step,
        dtype=dtype,
        chat=chat,
    )
    for r in report["results"]:
        typer.echo(r["text"] if chat else f"{r['prompt']}{r['text']}")
        typer.echo("-" * 40)
    write_json(json_out, report)


@app.command(
    "lm-eval",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
@runs_on("accelerator")
def lm_eval_cmd(ctx: typer.Context):
    """lm-eval's own command line (every flag of `lm_eval`) with the `olmax` model registered:
    olmax lm-eval --model olmax --model_args ckpt=C,tokenizer=dolma2 --tasks T [--include_path DIR ...]
    [--apply_chat_template instruct|think] [--system-instruction TEXT]"""
    from olmax.extras import require

    cli_evaluate = require("lm_eval.__main__", "olmax lm-eval").cli_evaluate
    import olmax.evals.lm_eval_adapter  # noqa: F401  (registers the `olmax` model)

    argv = sys.argv
    sys.argv = ["lm-eval", *lm_eval_args(ctx.args)]
    try:
        cli_evaluate()
    finally:
        sys.argv = argv


def lm_eval_args(args: list[str]) -> list[str]:
    """lm-eval's arguments from `olmax lm-eval`'s: `--system-instruction` is lm-eval's
    `--system_instruction`, and with `--model olmax`, `--apply_chat_template instruct|think` also
    gives the model its `chat_template` model_arg (lm-eval hands the name only to `chat_template()`,
    for its results file, not to the rendering of requests). lm-eval 0.4.13 merges repeated
    `--model_args` (_cli/utils.py, MergeDictAction), so it is passed as one more."""
    from olmax.data.chat import TEMPLATES

    out: list[str] = []
    for a in args:
        flag, eq, value = a.partition("=")
        out += [flag, value] if eq and flag in ("--system-instruction", "--apply_chat_template", "--model") else [a]
    out = ["--system_instruction" if a == "--system-instruction" else a for a in out]
    value = lambda flag: next((out[i + 1] for i, a in enumerate(out[:-1]) if a == flag), None)
    name = value("--apply_chat_template")
    if name in TEMPLATES and value("--model") == "olmax":
        out += ["--model_args", f"chat_template={name}"]
    return out
