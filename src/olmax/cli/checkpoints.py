"""`olmax convert | parity | ckpt warm-start | ckpt soup | ckpt inspect`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from olmax.cli.common import (
    CkptOpt,
    ConfigOpt,
    JsonOpt,
    OverridesArg,
    RecipeOpt,
    StepOpt,
    app,
    batch_option,
    checkpoint_errors,
    exits_on,
    resolve_experiment,
    runs_on,
    write_json,
)

_fail_on_bad_checkpoint = exits_on("conversion error", checkpoint_errors)


@app.command("convert")
@runs_on("cpu")
@_fail_on_bad_checkpoint
def convert_cmd(
    out: Path = typer.Option(..., "--out", help="the new checkpoint (olmax) or HF directory; must be new or empty"),
    from_hf: Optional[str] = typer.Option(
        None, "--from-hf", help="HF Olmo3ForCausalLM directory, or a hub id owner/name"
    ),
    revision: Optional[str] = typer.Option(None, "--revision", help="with a hub id: branch, tag or commit"),
    from_olmo_core: Optional[Path] = typer.Option(
        None,
        "--from-olmo-core",
        help="OLMo-core model state: .safetensors, .pt, or a distributed checkpoint "
        "(the stepN directory its trainer writes, or the model_and_optim in it)",
    ),
    to_hf: Optional[Path] = typer.Option(None, "--to-hf", help="olmax checkpoint to write as a HF directory"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="--to-hf weight dtype (default: the source's)"),
    step: Optional[int] = typer.Option(None, "--step", help="--to-hf checkpoint step (default: the latest)"),
    tokenizer: str = typer.Option(
        "dolma2",
        "--tokenizer",
        help="--to-hf tokenizer to write: dolma2, a HF tokenizer.json, or none (config, weights and "
        "generation config only)",
    ),
    chat: Optional[str] = typer.Option(
        None,
        "--chat",
        help="--to-hf: OLMo 3 chat template to write into tokenizer_config.json: instruct, think, think_dpo_rl, "
        "none, or auto (the default: the template the run's tokenized data records; none for a base model)",
    ),
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    json_out: Optional[Path] = JsonOpt,
):
    """Convert weights: HF or OLMo-core -> olmax checkpoint (step 0), or olmax -> HF.

    --from-olmo-core needs the architecture, from --recipe/--config and overrides (a state dict has none).
    """
    chosen = [
        name
        for name, value in (("--from-hf", from_hf), ("--from-olmo-core", from_olmo_core), ("--to-hf", to_hf))
        if value is not None
    ]
    if len(chosen) != 1:
        raise typer.BadParameter("give exactly one of --from-hf, --from-olmo-core, --to-hf")
    if chat is not None and to_hf is None:
        raise typer.BadParameter("--chat only applies to --to-hf")
    if (recipe or config or overrides) and not from_olmo_core:
        raise typer.BadParameter("--recipe/--config/overrides only apply to --from-olmo-core")
    if from_hf is not None:
        from olmax.convert.hf import convert_from_hf

        summary = convert_from_hf(from_hf, out, revision=revision)
    elif to_hf is not None:
        from olmax.convert.hf import convert_to_hf

        summary = convert_to_hf(to_hf, out, dtype=dtype, step=step, tokenizer=tokenizer, chat=chat or "auto")
    else:
        from olmax.convert.olmo_core import convert_from_olmo_core

        if not (recipe or config):
            raise typer.BadParameter("--from-olmo-core needs --recipe or --config for the architecture")
        exp = resolve_experiment(recipe, config, overrides)
        tokens = {
            "eos_token_id": exp.data.eos_token_id,
            "pad_token_id": exp.data.pad_token_id,
            "bos_token_id": exp.data.bos_token_id,
        }
        summary = convert_from_olmo_core(from_olmo_core, exp.model, out, special_tokens=tokens)
    typer.echo(" ".join(f"{k}={v}" for k, v in summary.items() if k != "note"))
    if "note" in summary:  # e.g. --to-hf --tokenizer none: what the export lacks
        typer.echo(summary["note"])
    write_json(json_out, summary)


@app.command("parity")
@runs_on("accelerator")
@_fail_on_bad_checkpoint
def parity_cmd(
    hf: str = typer.Option(..., "--hf", help="HF Olmo3ForCausalLM directory (the reference)"),
    ckpt: str = CkptOpt,
    dtype: str = typer.Option("float32", "--dtype", help="float32 or bfloat16: weights and compute on both sides"),
    seq_len: int = typer.Option(512, "--seq-len", help="length of the random token sequences"),
    batch: int = batch_option(1),
    seed: int = typer.Option(0, "--seed", help="seed of the random tokens"),
    max_kl: Optional[float] = typer.Option(
        None, "--max-kl", help="PASS needs kl_mean at most this, nats (default 1e-6 float32, 5e-3 bfloat16)"
    ),
    min_top1: Optional[float] = typer.Option(
        None, "--min-top1", help="PASS needs top1_agreement at least this (default 0.999 float32, 0.9 bfloat16)"
    ),
    max_logit_diff: Optional[float] = typer.Option(
        None,
        "--max-logit-diff",
        help="PASS needs max_abs_logit_diff at most this (default 1e-2 float32; not judged in bfloat16)",
    ),
    layer_tol: Optional[float] = typer.Option(
        None, "--layer-tol", help="per-layer RMS-relative tolerance (default 1e-3 float32, 0.1 bfloat16)"
    ),
    json_out: Optional[Path] = JsonOpt,
):
    """Logits and per-layer hidden states of olmax (the checkpoint's latest step) against transformers on
    the same random tokens, and the verdict: PASS (exit 0) when every figure is within the bounds of a
    correct conversion in that dtype, FAIL (exit 3) otherwise; bad input exits 2 (docs/conversion.md)."""
    from dataclasses import replace

    from olmax.extras import require

    for reference in ("torch", "transformers"):
        require(reference, "olmax parity")
    from olmax.parity.logits import PARITY_BOUNDS, PARITY_DTYPES, PARITY_FAIL_EXIT, run_hf_parity

    if dtype not in PARITY_DTYPES:
        raise typer.BadParameter(f"--dtype must be one of {', '.join(PARITY_DTYPES)}")
    given = {"max_kl_mean": max_kl, "min_top1": min_top1, "max_logit_diff": max_logit_diff, "layer_tol": layer_tol}
    if min_top1 is not None and not 0 <= min_top1 <= 1:
        raise typer.BadParameter(f"--min-top1 must be within 0..1, got {min_top1:g}")
    for flag, value in (("--max-kl", max_kl), ("--max-logit-diff", max_logit_diff), ("--layer-tol", layer_tol)):
        if value is not None and not value >= 0:
            raise typer.BadParameter(f"{flag} must be >= 0, got {value:g}")
    bounds = replace(PARITY_BOUNDS[dtype], **{k: v for k, v in given.items() if v is not None})
    report = run_hf_parity(hf, str(ckpt), dtype=dtype, seq_len=seq_len, batch=batch, seed=seed, bounds=bounds)
    for key in ("kl_mean", "kl_max", "top1_agreement", "top10_overlap", "max_abs_logit_diff"):
        typer.echo(f"{key:>22} {report[key]:.6g}")
    typer.echo(
        f"{'first_divergent_layer':>22} {report['first_divergent_layer']} "
        f"(tolerance {report['layer_tolerance']:g} of the layer RMS)"
    )
    typer.echo(f"{'layer_rel_diff':>22} " + " ".join(f"{x:.2e}" for x in report["layer_rel_diff"]))
    write_json(json_out, report)
    if report["broken"]:
        typer.echo(f"verdict: FAIL ({dtype}): " + "; ".join(report["broken"]))
        raise typer.Exit(PARITY_FAIL_EXIT)
    typer.echo(f"verdict: PASS ({dtype}: {bounds.describe()})")


ckpt_app = typer.Typer(
    no_args_is_help=True, help="Inspect training checkpoints, warm-start new stages from them, average (soup) them."
)


app.add_typer(ckpt_app, name="ckpt")


@ckpt_app.command("warm-start")
@runs_on("accelerator")  # a whole training state, spread over the host's chips where it has them
@exits_on("ckpt warm-start", checkpoint_errors)
def ckpt_warm_start_cmd(
    paths: list[str] = typer.Argument(
        ...,
        metavar="SRC DST | DST [OVERRIDES]...",
        help="SRC: a run's checkpoint directory (RUN_DIR/checkpoints); DST: new directory for the warm-start "
        "checkpoint (local or gs://). With --from-olmo-core: DST, then dotted overrides of --recipe/--config",
    ),
    from_olmo_core: Optional[Path] = typer.Option(
        None,
        "--from-olmo-core",
        help="instead of SRC: an OLMo-core checkpoint (its stepN directory, or the "
        "model_and_optim distributed checkpoint in it)",
    ),
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    keep: str = typer.Option(
        "params,moments", "--keep", help="params, or params,moments (Adam moments and their bias-correction counter)"
    ),
    reset_step: bool = typer.Option(
        False, "--reset-step", help="step 0: restart the schedule, empty the skip-step window, drop the data state"
    ),
    step: Optional[int] = StepOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Write a checkpoint for `checkpoint.init_from=DST` that keeps parameters (and Adam moments).

    --from-olmo-core takes them (and the trainer's step) from an OLMo-core checkpoint; the experiment the
    next stage runs comes from --recipe/--config and overrides, whose model must be the checkpoint's.
    """
    kept = tuple(k.strip() for k in keep.split(",") if k.strip())
    if from_olmo_core is not None:
        from olmax.convert.olmo_core import warm_start_from_olmo_core

        if step is not None:
            raise typer.BadParameter("--step does not apply to --from-olmo-core (give the stepN directory)")
        dst, overrides = paths[0], paths[1:]
        summary = warm_start_from_olmo_core(
            from_olmo_core, dst, resolve_experiment(recipe, config, overrides), keep=kept, reset_step=reset_step
        )
        src = f"OLMo-core checkpoint {from_olmo_core}"
    else:
        from olmax.checkpoint.surgery import warm_start

        if len(paths) != 2 or recipe or config:
            raise typer.BadParameter(
                "give SRC DST (a run's checkpoints and the new directory), or --from-olmo-core "
                "DIR with DST, --recipe/--config and overrides"
            )
        src, dst = paths
        summary = warm_start(src, dst, keep=kept, reset_step=reset_step, step=step)
    typer.echo(
        f"wrote {dst} (step {summary['step']}, kept {','.join(summary['keep'])}, Adam counter "
        f"{summary['adam_count']}) from {src} step {summary['source_step']}; start the next stage "
        f"with checkpoint.init_from={dst}"
    )
    write_json(json_out, summary)


@ckpt_app.command("soup")
@runs_on("accelerator")
@exits_on("ckpt soup", checkpoint_errors)
def ckpt_soup_cmd(
    ckpts: list[str] = typer.Argument(
        ...,
        metavar="CKPT",
        help="checkpoints to average: a checkpoint directory (RUN_DIR/checkpoints: its newest step) or one "
        "step of it (RUN_DIR/checkpoints/N); local or gs://",
    ),
    out: str = typer.Option(..., "--out", help="the soup checkpoint (local or gs://); must be new or empty"),
    weights: Optional[str] = typer.Option(
        None, "--weights", help="w1,w2,...: one positive weight per CKPT, divided by their sum (default: equal)"
    ),
    params_only: bool = typer.Option(
        False, "--params-only", help="average and write the parameters only (no optimizer state)"
    ),
    json_out: Optional[Path] = JsonOpt,
):
    """Average checkpoints in float32 (OLMo-core's merge script): parameters and AdamW moments.

    Step, Adam counter, skip window and data position come from the first CKPT (docs/checkpoints.md).
    """
    from olmax.checkpoint.surgery import soup

    try:
        parsed = None if weights is None else [float(w) for w in weights.split(",")]
    except ValueError:
        raise typer.BadParameter(f"--weights must be numbers separated by commas, got {weights!r}") from None
    summary = soup(ckpts, out, weights=parsed, params_only=params_only)
    mixed = " + ".join(f"{c['weight']:.6g} x {c['checkpoint']} step {c['step']}" for c in summary["checkpoints"])
    kind = "parameters" if params_only else "parameters and Adam moments"
    typer.echo(f"wrote {out} (step {summary['step']}, {kind}, float32) = {mixed}")
    write_json(json_out, summary)


@ckpt_app.command("inspect")
@runs_on("cpu")
@exits_on("ckpt inspect", checkpoint_errors)
def ckpt_inspect_cmd(
    ckpt: str = typer.Argument(..., help="a run's checkpoint directory (RUN_DIR/checkpoints); local or gs://"),
    step: Optional[int] = StepOpt,
    against: Optional[str] = typer.Option(
        None, "--against", help="another checkpoint directory: show the config keys that differ"
    ),
    json_out: Optional[Path] = JsonOpt,
):
    """Step, tokens, mesh, array shapes and dtypes, data state and config of a checkpoint."""
    from olmax.checkpoint.surgery import inspect

    r = inspect(ckpt, step=step, against=against)
    meta = r["meta"]
    typer.echo(
        f"{r['directory']} step {r['step']} (steps {r['steps']}); tokens seen {r['tokens_seen']}; "
        f"mesh {meta.get('mesh')}; olmax {meta.get('olmax_version')}"
    )
    if "warm_start" in meta:
        typer.echo(f"warm start: {meta['warm_start']}")
    if "soup" in meta:
        typer.echo(f"soup: {meta['soup']}")
    for group in ("params", "opt_state"):
        typer.echo(f"{group}:")
        for name, a in r[group].items():
            typer.echo(f"  {name:60s} {str(tuple(a['shape'])):20s} {a['dtype']}")
    typer.echo(f"data: {json.dumps(r['data'])}")
    if against is not None:
        typer.echo(
            f"config diff against {r['against']} (this -> other):"
            if r["config_diff"]
            else f"config identical to {r['against']}"
        )
        for key, (mine, theirs) in r["config_diff"].items():
            typer.echo(f"  {key}: {mine!r} -> {theirs!r}")
    write_json(json_out, r)
