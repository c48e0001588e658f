"""`olmax tokenize | data order | data check`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from olmax.cli.common import (
    ConfigOpt,
    JsonOpt,
    OverridesArg,
    RecipeOpt,
    SeqLenOpt,
    TokenizerOpt,
    WorkDirOpt,
    app,
    data_errors,
    exits_on,
    resolve_experiment,
    runs_on,
    write_json,
)
from olmax.errors import ConfigError

_fail_on_bad_data = exits_on("data error", data_errors)


@app.command("tokenize")
@runs_on("cpu")
@_fail_on_bad_data
def tokenize_cmd(
    inputs: list[Path] = typer.Argument(..., help=".jsonl / .jsonl.gz / .jsonl.zst (a `text` field) or .txt files"),
    out: Path = typer.Option(..., "--out", help="output directory for the shards and manifest.json"),
    tokenizer: str = TokenizerOpt,
    workers: int = typer.Option(0, "--workers", help="encoding processes (0 = in this process)"),
    shard_tokens: int = typer.Option(1 << 26, "--shard-tokens", help="tokens per shard (closed at a document end)"),
    chat: Optional[str] = typer.Option(
        None,
        "--chat",
        help="instruct|think|think_dpo_rl: inputs are chat rows (`messages`, or `chosen`/`rejected`; .jsonl* or "
        ".parquet), rendered with that OLMo 3 template and written with label masks as AI2's SFT files "
        "(docs/post-training/chat-data.md)",
    ),
    max_seq_len: Optional[int] = typer.Option(
        None, "--max-seq-len", help="--chat: truncate longer conversations to this many tokens (as AI2 did)"
    ),
    json_out: Optional[Path] = JsonOpt,
):
    """Tokenize text into raw token shards OLMo-core and olmax read (resumes an interrupted run); with
    --chat, conversations into token ids and label masks."""
    from olmax.data.tokenize import TokenizeError, tokenize_files

    if chat is not None:
        from olmax.data.chat import TEMPLATES
        from olmax.data.chat_files import eos_reading_note, tokenize_chat

        if chat not in TEMPLATES:
            raise TokenizeError(f"--chat {chat!r}: expected one of {', '.join(TEMPLATES)}")
        manifests = tokenize_chat(
            inputs, out, chat, tokenizer=tokenizer, max_seq_len=max_seq_len, shard_tokens=shard_tokens
        )
        for sub, m in manifests.items():
            c = m["chat"]
            skipped = ",".join(f"{k}:{v}" for k, v in sorted(c["skipped"].items())) or "0"
            typer.echo(
                f"out={out / sub} parts={len(m['shards'])} tokens={m['total_tokens']} "
                f"trainable={c['trainable_tokens']} rows={c['rows']} written={c['written']} "
                f"truncated={c['truncated']} skipped={skipped} dtype={m['dtype']}"
            )
            note = eos_reading_note(c)
            if note:
                typer.echo(f"note: {note}", err=True)
        write_json(json_out, manifests)
        return
    if max_seq_len is not None:
        raise TokenizeError("--max-seq-len applies to --chat only")
    manifest = tokenize_files(inputs, out, tokenizer=tokenizer, workers=workers, shard_tokens=shard_tokens)
    summary = {
        "out": str(out),
        "shards": len(manifest["shards"]),
        "tokens": manifest["total_tokens"],
        "documents": sum(s["documents"] for s in manifest["sources"]),
        "dtype": manifest["dtype"],
    }
    typer.echo(" ".join(f"{k}={v}" for k, v in summary.items()))
    write_json(json_out, manifest)


data_app = typer.Typer(no_args_is_help=True, help="Inspect training data: order of instances, file checks.")


app.add_typer(data_app, name="data")


# Shorthand flags of the data commands: each sets one config field (docs/config.md, "Resolution"), so
# `--seq-len 2048` is `data.seq_len=2048`; left out, the field keeps the recipe's or config's value.
PathsOpt = typer.Option(
    None,
    "--paths",
    help="data.paths: shards, globs, tokenize output dirs, mix files, jsonl text or demo (repeat the flag)",
)


MaxTargetOpt = typer.Option(
    None, "--max-target-seq-len", help="data.max_target_seq_len (OLMo-core's max_target_sequence_length)"
)


VocabOpt = typer.Option(None, "--vocab-size", help="data.vocab_size (the tokenizer's vocabulary)")


EosOpt = typer.Option(None, "--eos-id", help="data.eos_token_id")


PadOpt = typer.Option(None, "--pad-id", help="data.pad_token_id")


MixBaseOpt = typer.Option(None, "--mix-base", help="data.mix_base: base dir or URL of a mix file's paths")


def _data_shorthands(paths, seq_len, max_target, vocab_size, eos, pad, mix_base, work_dir) -> dict:
    return {
        "data.paths": paths or None,
        "data.seq_len": seq_len,
        "data.max_target_seq_len": max_target,
        "data.vocab_size": vocab_size,
        "data.eos_token_id": eos,
        "data.pad_token_id": pad,
        "data.mix_base": mix_base,
        "data.work_dir": work_dir,
    }


@data_app.command("order")
@runs_on("cpu")
@_fail_on_bad_data
def data_order_cmd(
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    paths: Optional[list[str]] = PathsOpt,
    seq_len: Optional[int] = SeqLenOpt,
    seed: Optional[int] = typer.Option(None, "--seed", help="data.seed"),
    global_batch: Optional[int] = typer.Option(
        None,
        "--global-batch",
        help="trainer.global_batch: items per global batch (token instances; pairs with trainer.objective=dpo)",
    ),
    renamed_global_batch: Optional[int] = typer.Option(
        None, "--global-batch-instances", hidden=True, help="refused: now --global-batch"
    ),
    epoch: int = typer.Option(1, "--epoch", help="epochs count from 1"),
    dp_size: int = typer.Option(1, "--dp-size", help="data-parallel ranks the global batch is split over"),
    dp_rank: Optional[int] = typer.Option(None, "--dp-rank", help="one rank only (default: all)"),
    steps: str = typer.Option("1:2", "--steps", help="a:b = steps a..b-1; step s (1-based) trains on batch s-1"),
    max_target: Optional[int] = MaxTargetOpt,
    vocab_size: Optional[int] = VocabOpt,
    eos: Optional[int] = EosOpt,
    pad: Optional[int] = PadOpt,
    mix_base: Optional[str] = MixBaseOpt,
    work_dir: Optional[str] = WorkDirOpt,
    with_tokens: bool = typer.Option(
        False,
        "--with-tokens",
        help="add each instance's tokens, doc_lens and (data.label_masks) label_mask to the JSON (rank's `instances`); "
        "for DPO pairs, each side's tokens and label_mask; for a plug-in kind's items, each row's",
    ),
    json_out: Optional[Path] = JsonOpt,
):
    """Which instances (file, token offset; or packed group, bin, documents, padding) each data-parallel rank
    saw at each step, as OLMo-core orders them; for an objective on items read from files (dpo's preference
    pairs, a plug-in data kind's items), which items.

    The data and global batch are the experiment's (--recipe/--config and overrides; without either, the
    config defaults); the flags are shorthands for single fields. `olmax tokenize --chat` output is read as
    AI2's SFT reads it with data.packing=obfd data.label_masks=true data.doc_masking=true, plus
    data.use_array_if_local=false where tokenize printed a note (docs/data.md, "Chat parts")."""
    from olmax.config.objective import data_kind
    from olmax.data.loader import order_report
    from olmax.data.pairs import item_source, pair_order_report

    if renamed_global_batch is not None:  # its old name, which said instances where a DPO batch counts pairs
        raise typer.BadParameter(
            "--global-batch-instances is now --global-batch (trainer.global_batch, which counts items: token "
            "instances, or pairs with trainer.objective=dpo)"
        )
    try:
        a, b = (int(x) for x in steps.split(":"))
    except ValueError:
        raise typer.BadParameter(f"--steps {steps!r} is not of the form a:b") from None
    exp = resolve_experiment(
        recipe,
        config,
        overrides,
        {
            **_data_shorthands(paths, seq_len, max_target, vocab_size, eos, pad, mix_base, work_dir),
            "data.seed": seed,
            "trainer.global_batch": global_batch,
        },
        need_base=False,
    )
    kind = data_kind(exp.objective_config)
    if kind == "rollouts":  # sampled by the RL loop at each step: no order of the files says what a step trains on
        raise ConfigError(
            f"olmax data order: trainer.objective={exp.trainer.objective} trains on the data kind 'rollouts', "
            "sampled and packed by the RL loop at each step; it reports the order of token instances and of "
            "items read from files (pairs, a plug-in kind's)"
        )
    orders = dict(epoch=epoch, dp_size=dp_size, dp_rank=dp_rank, with_tokens=with_tokens)
    if kind == "tokens":
        report = order_report(exp.data, exp.trainer.global_batch, range(a, b), **orders)
    else:  # items read from files, in the loader's order: the pairs, or the plug-in kind's source
        source = item_source(exp)
        report = pair_order_report(exp.data, exp.trainer.global_batch, range(a, b), **orders, source=source)
    unit = report.get("kind", "instances")
    dropped = f" ({report['dropped']} dropped: a side with no trained token)" if report.get("dropped") else ""
    typer.echo(
        f"fingerprint {report['fingerprint']}  {unit} {report['instances']}{dropped}  "
        f"batches/epoch {report['batches_per_epoch']}"
    )
    for step in report["steps"]:
        for rank in step["ranks"]:
            more = f", ... ({len(rank['ids'])} {unit})" if len(rank["ids"]) > 4 else ""
            shown = _first_four(kind, report, rank)
            typer.echo(f"step {step['step']} (batch {step['batch']}) rank {rank['rank']}: {shown}{more}")
    write_json(json_out, report)


def _first_four(kind: str, report: dict, rank: dict) -> str:
    """A rank's first four ids of a step in `olmax data order`'s lines, with where each comes from."""
    if kind == "pairs":  # kept-pair id, then its document in chosen/ and rejected/
        return ", ".join(f"{i}@doc{d}" for i, d in list(zip(rank["ids"], rank["documents"]))[:4])
    if kind != "tokens":  # a plug-in kind's item ids (its source's numbering)
        return ", ".join(str(i) for i in rank["ids"][:4])
    if "documents" in rank:  # packed: group/bin, then documents and padding tokens
        packed = zip(rank["ids"], rank["group"], rank["bin"], rank["documents"], rank["padding"])
        return ", ".join(f"{i}@group{g}/bin{b} ({d} docs, {p} pad)" for i, g, b, d, p in list(packed)[:4])
    chunks = zip(rank["ids"], rank["file"], rank["offset"])
    return ", ".join(f"{i}@{report['files'][f].rsplit('/', 1)[-1]}:{o}" for i, f, o in list(chunks)[:4])


@data_app.command("check")
@runs_on("cpu")
@_fail_on_bad_data
def data_check_cmd(
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    paths: Optional[list[str]] = PathsOpt,
    seq_len: Optional[int] = SeqLenOpt,
    max_target: Optional[int] = MaxTargetOpt,
    vocab_size: Optional[int] = VocabOpt,
    eos: Optional[int] = EosOpt,
    pad: Optional[int] = PadOpt,
    mix_base: Optional[str] = MixBaseOpt,
    work_dir: Optional[str] = WorkDirOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Read every token of every file and check sizes, headers and ids against the vocabulary.

    The data is the experiment's (--recipe/--config and overrides, or the config defaults); the flags are
    shorthands for single data.* fields."""
    from olmax.data.loader import build_source

    exp = resolve_experiment(
        recipe,
        config,
        overrides,
        _data_shorthands(paths, seq_len, max_target, vocab_size, eos, pad, mix_base, work_dir),
        need_base=False,
    )
    report = build_source(exp.data).check_all()
    typer.echo(" ".join(f"{k}={v}" for k, v in report.items()))
    write_json(json_out, report)
