"""`olmax eval loss | domains | tasks | kl`, `olmax compare`, `olmax verify`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from olmax.cli.common import (
    CkptOpt,
    ConfigOpt,
    DomainsByOpt,
    DtypeOpt,
    EvalDataOpt,
    IncludePathOpt,
    JsonOpt,
    LimitOpt,
    LossChunkOpt,
    MaxDocsOpt,
    OverridesArg,
    RecipeOpt,
    SeqLenOpt,
    StepOpt,
    TaskDataDirOpt,
    TokenizerOpt,
    WorkDirOpt,
    app,
    batch_option,
    eval_errors,
    exits_on,
    max_batches_option,
    resolve_experiment,
    runs_on,
    write_json,
)

eval_app = typer.Typer(no_args_is_help=True, help="Held-out evaluation of checkpoints (docs/verification.md).")


app.add_typer(eval_app, name="eval")


_fail_on_bad_eval_input = exits_on("eval error", eval_errors)


def _eval_experiment(recipe, config, overrides, shorthands: dict, *, need_data: bool = True):
    """The experiment whose data section (tokenizer, special tokens, mix base, cache) and eval.data the
    eval reads, resolved as every command resolves it (docs/config.md); the model is the checkpoint's."""
    exp = resolve_experiment(recipe, config, overrides, shorthands, need_base=False)
    if need_data and not exp.eval.data:
        raise typer.BadParameter("no eval data: give --data or the override eval.data=[...]")
    return exp


def _seq_len(exp, recipe, config, overrides, seq_len: Optional[int]) -> Optional[int]:
    """The eval length the user set (--seq-len, --recipe/--config or the override data.seq_len), or
    None: then the checkpoint's own training data.seq_len (olmax.evals.scoring.eval_seq_len)."""
    by_override = any(o.split("=", 1)[0].strip() == "data.seq_len" for o in overrides or [])
    return exp.data.seq_len if seq_len is not None or recipe or config or by_override else None


def _output_chunk(loss_chunk: Optional[int]) -> int:
    from olmax.evals.scoring import OUTPUT_CHUNK

    return OUTPUT_CHUNK if loss_chunk is None else loss_chunk


@eval_app.command("loss")
@runs_on("accelerator")
@_fail_on_bad_eval_input
def eval_loss_cmd(
    ckpt: str = CkptOpt,
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    data: Optional[list[str]] = EvalDataOpt,
    seq_len: Optional[int] = SeqLenOpt,
    batch: int = batch_option(8),
    max_batches: Optional[int] = max_batches_option(None),
    step: Optional[int] = StepOpt,
    dtype: Optional[str] = DtypeOpt,
    loss_chunk: Optional[int] = LossChunkOpt,
    work_dir: Optional[str] = WorkDirOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Held-out CE loss on fixed, identical batches (OLMo-core's evaluator loss).

    The data settings come from --recipe/--config and overrides (default: the config defaults); the
    flags are shorthands for single fields. The sequence length, unless --seq-len, --recipe/--config
    or an override sets it, is the checkpoint's own training data.seq_len (docs/verification.md)."""
    from olmax.evals.heldout import eval_loss

    exp = _eval_experiment(
        recipe, config, overrides, {"eval.data": data or None, "data.seq_len": seq_len, "data.work_dir": work_dir}
    )
    report = eval_loss(
        str(ckpt),
        exp.eval.data,
        seq_len=_seq_len(exp, recipe, config, overrides, seq_len),
        batch=batch,
        max_batches=max_batches,
        data_cfg=exp.data,
        step=step,
        compute_dtype=dtype,
        loss_chunk=_output_chunk(loss_chunk),
    )
    for name, r in report["results"].items():
        typer.echo(f"eval/{name}/CE loss {r['CE loss']:.6f}  PPL {r['PPL']:.4f}  tokens {r['tokens']}")
    write_json(json_out, report)


@eval_app.command("domains")
@runs_on("accelerator")
@_fail_on_bad_eval_input
def eval_domains_cmd(
    ckpt: str = CkptOpt,
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    data: Path = typer.Option(..., "--data", help="directory of held-out .jsonl(.gz) files, or one file"),
    by: str = DomainsByOpt,
    seq_len: Optional[int] = SeqLenOpt,
    batch: int = batch_option(8),
    max_docs: Optional[int] = MaxDocsOpt,
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="data.tokenizer: dolma2 or a HF tokenizer.json"),
    step: Optional[int] = StepOpt,
    dtype: Optional[str] = DtypeOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Per-domain loss, perplexity and bits per byte (Paloma-style), with macro and micro averages.

    The tokenizer is the experiment's (--recipe/--config and overrides, or the config defaults). Long
    documents are scored in windows of the sequence length: unless --seq-len, --recipe/--config or an
    override sets it, the checkpoint's own training data.seq_len (docs/verification.md)."""
    from olmax.evals.domains import eval_domains, format_domains

    exp = _eval_experiment(
        recipe, config, overrides, {"data.tokenizer": tokenizer, "data.seq_len": seq_len}, need_data=False
    )
    report = eval_domains(
        str(ckpt),
        str(data),
        seq_len=_seq_len(exp, recipe, config, overrides, seq_len),
        batch=batch,
        by=by,
        max_docs=max_docs,
        tokenizer=exp.data.tokenizer,
        step=step,
        compute_dtype=dtype,
    )
    typer.echo(format_domains(report))
    write_json(json_out, report)


@eval_app.command("tasks")
@runs_on("accelerator")
@_fail_on_bad_eval_input
def eval_tasks_cmd(
    ckpt: str = CkptOpt,
    tasks: str = typer.Option(
        "mmlu,hellaswag,arc_easy,arc_challenge,openbookqa,piqa,boolq,winogrande",
        "--tasks",
        help="comma-separated lm-eval task names",
    ),
    num_fewshot: Optional[int] = typer.Option(
        None, "--num-fewshot", help="shots for every task (default: mmlu 5, others lm-eval's)"
    ),
    data_dir: Optional[Path] = TaskDataDirOpt,
    include_path: Optional[list[Path]] = IncludePathOpt,
    tokenizer: str = TokenizerOpt,
    batch: int = batch_option(8),
    limit: Optional[int] = LimitOpt,
    max_length: Optional[int] = typer.Option(
        None,
        "--max-length",
        help="context length (default: the checkpoint's training data.seq_len, else its max_position)",
    ),
    step: Optional[int] = StepOpt,
    dtype: Optional[str] = DtypeOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Downstream tasks through lm-eval-harness (the `olmax` model; needs the `eval` extra): every metric
    per task with its stderr, and the generations of generate_until tasks in the --json report.

    Task data comes from the HF hub unless --data-dir holds local copies; a task whose data cannot
    be reached is an error naming it (exit 2)."""
    from olmax.extras import require

    require("lm_eval", "olmax eval tasks")
    from olmax.evals.tasks import format_tasks, run_tasks

    report = run_tasks(
        str(ckpt),
        [t for t in tasks.split(",") if t],
        num_fewshot=num_fewshot,
        data_dir=str(data_dir) if data_dir else None,
        include_path=[str(p) for p in include_path or []],
        tokenizer=tokenizer,
        batch_size=batch,
        limit=limit,
        max_length=max_length,
        step=step,
        dtype=dtype,
    )
    typer.echo(format_tasks(report))
    write_json(json_out, report)


@eval_app.command("kl")
@runs_on("accelerator")
@_fail_on_bad_eval_input
def eval_kl_cmd(
    ckpt_a: str = typer.Option(..., "--ckpt-a", help="reference olmax checkpoint (A in KL(A||B))"),
    ckpt_b: str = typer.Option(..., "--ckpt-b", help="olmax checkpoint compared with it"),
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    data: Optional[list[str]] = EvalDataOpt,
    seq_len: Optional[int] = SeqLenOpt,
    batch: int = batch_option(4),
    max_batches: Optional[int] = max_batches_option(4),
    buckets: Optional[str] = typer.Option(
        None, "--buckets", help="position bucket starts, e.g. 0,128,1024 (default 0,16,64,... x4)"
    ),
    step_a: Optional[int] = typer.Option(None, "--step-a", help="A's checkpoint step (default: the latest)"),
    step_b: Optional[int] = typer.Option(None, "--step-b", help="B's checkpoint step (default: the latest)"),
    dtype: Optional[str] = DtypeOpt,
    loss_chunk: Optional[int] = LossChunkOpt,
    work_dir: Optional[str] = WorkDirOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Per-token KL(A||B) (mean, median, p90, p99) and top-1 agreement, by position bucket.

    The data settings come from --recipe/--config and overrides (default: the config defaults); the
    flags are shorthands for single fields. The sequence length, unless --seq-len, --recipe/--config
    or an override sets it, is A's own training data.seq_len (docs/verification.md)."""
    from olmax.evals.kl import eval_kl, format_kl

    exp = _eval_experiment(
        recipe, config, overrides, {"eval.data": data or None, "data.seq_len": seq_len, "data.work_dir": work_dir}
    )
    edges = [int(x) for x in buckets.split(",")] if buckets else None
    report = eval_kl(
        str(ckpt_a),
        str(ckpt_b),
        exp.eval.data,
        seq_len=_seq_len(exp, recipe, config, overrides, seq_len),
        batch=batch,
        max_batches=max_batches,
        buckets=edges,
        data_cfg=exp.data,
        step_a=step_a,
        step_b=step_b,
        compute_dtype=dtype,
        loss_chunk=_output_chunk(loss_chunk),
    )
    typer.echo(format_kl(report))
    write_json(json_out, report)


@app.command("compare")
@runs_on("cpu")
def compare_cmd(
    run_a: str = typer.Argument(
        ..., help="run A: metrics.jsonl, a run dir (metrics.jsonl or TensorBoard events), or a W&B .csv"
    ),
    run_b: str = typer.Argument(..., help="run B, in any of the same forms"),
    out: Path = typer.Option(..., "--out", help="directory for overlay.png, paired_diff.png, compare.md, compare.json"),
    metric: str = typer.Option("train/CE loss", "--metric", help="metric name as logged (OLMo-core W&B names)"),
    ref_csv: Optional[str] = typer.Option(
        None, "--ref-csv", help="W&B CSV export of a reference run, drawn and tabled too"
    ),
    bin_size: Optional[int] = typer.Option(
        None, "--bin", help="steps per bin (default: the largest of 1, 2, 5, 10, 20, ... giving each run 20 bins)"
    ),
    smooth: int = typer.Option(1, "--smooth", help="trailing moving average over this many bins"),
    landmarks: Optional[str] = typer.Option(
        None, "--landmarks", help="steps for the gap table, e.g. 1000,5000 (default: 8 spread bins)"
    ),
    tolerance: float = typer.Option(0.0, "--tolerance", help="paired diff: largest |B - A| still counted as equal"),
    label_a: Optional[str] = typer.Option(
        None, "--label-a", help="name of run A in the report (default: its file name)"
    ),
    label_b: Optional[str] = typer.Option(
        None, "--label-b", help="name of run B in the report (default: its file name)"
    ),
    json_out: Optional[Path] = JsonOpt,
):
    """Two runs side by side: binned overlay with a gap panel, gap table at landmarks, per-step paired diff."""
    from olmax.evals.compare import compare_runs

    try:
        report = compare_runs(
            run_a,
            run_b,
            out,
            metric=metric,
            bin_size=bin_size,
            smooth=smooth,
            landmarks=[int(x) for x in landmarks.split(",")] if landmarks else None,
            ref_csv=ref_csv,
            label_a=label_a,
            label_b=label_b,
            tolerance=tolerance,
        )
    except (ValueError, FileNotFoundError) as e:  # RunFormatError is a ValueError
        typer.echo(f"compare error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo((out / "compare.md").read_text(), nl=False)
    write_json(json_out, report)


@app.command("verify")
@runs_on("accelerator")
@exits_on("verify error", lambda: (ValueError, FileNotFoundError))  # CheckpointError is a ValueError
def verify_cmd(
    a: str = typer.Option(
        ...,
        "--a",
        help="run A: a run directory (its checkpoints/), a checkpoint directory, "
        "or one checkpoint (a step directory, e.g. run/checkpoints/40)",
    ),
    b: str = typer.Option(
        ...,
        "--b",
        help="run B, in any of those forms; two single checkpoints are compared as given, whatever their steps",
    ),
    out: Path = typer.Option(..., "--out", help="directory for verify.md, verify.json and the PNGs"),
    landmarks: Optional[str] = typer.Option(
        None, "--landmarks", help="steps, e.g. 1000,5000 (default: every step both hold)"
    ),
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    data: Optional[list[str]] = EvalDataOpt,
    seq_len: Optional[int] = SeqLenOpt,
    batch: int = batch_option(8),
    max_batches: Optional[int] = max_batches_option(4),
    domains: Optional[str] = typer.Option(
        None, "--domains", help="held-out jsonl directory for per-domain loss (as `eval domains`)"
    ),
    by: str = DomainsByOpt,
    max_docs: Optional[int] = MaxDocsOpt,
    tasks: Optional[str] = typer.Option(
        None, "--tasks", help="comma-separated lm-eval tasks (skipped without lm-eval)"
    ),
    data_dir: Optional[Path] = TaskDataDirOpt,
    include_path: Optional[list[Path]] = IncludePathOpt,
    limit: Optional[int] = LimitOpt,
    sigmas: float = typer.Option(2.0, "--sigmas", help="verdict rule: |delta| <= this many sigma is within noise"),
    kl_floor: float = typer.Option(1.5e-3, "--kl-floor", help="mean KL (nats) at or below which KL is within noise"),
    work_dir: Optional[str] = WorkDirOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Compare A and B at step-aligned landmarks on held-out loss, domains, tasks and KL: one report.

    The data settings come from --recipe/--config and overrides (default: the config defaults); the
    held-out data for loss and KL is --data (as `eval loss`; default demo:heldout). The sequence
    length of every surface, unless --seq-len, --recipe/--config or an override sets it, is A's own
    training data.seq_len (docs/verification.md)."""
    from olmax.evals.verify import SURFACE_NAMES, rules, verify

    exp = _eval_experiment(
        recipe,
        config,
        overrides,
        {"eval.data": data or None, "data.seq_len": seq_len, "data.work_dir": work_dir},
        need_data=False,
    )
    report = verify(
        a,
        b,
        out,
        landmarks=[int(s) for s in landmarks.split(",") if s] if landmarks else None,
        data=list(exp.eval.data) or ["demo:heldout"],
        seq_len=_seq_len(exp, recipe, config, overrides, seq_len),
        batch=batch,
        max_batches=max_batches,
        domains=domains,
        by=by,
        max_docs=max_docs,
        tasks=[t for t in tasks.split(",") if t] if tasks else None,
        data_dir=str(data_dir) if data_dir else None,
        include_path=[str(p) for p in include_path or []],
        limit=limit,
        sigmas=sigmas,
        kl_floor=kl_floor,
        data_cfg=exp.data,
    )
    for surface, v in report["verdicts"].items():
        typer.echo(f"{SURFACE_NAMES[surface]:24s} {v:14s} ({rules(report)[surface]})")
    typer.echo(f"report: {out / 'verify.md'}")
    write_json(json_out, report)
