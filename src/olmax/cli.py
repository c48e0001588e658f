"""The `olmax` command line: parses arguments and dispatches to the library, nothing else.

Every subcommand that reports figures takes `--json FILE` and writes them there too.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from olmax.config import ConfigError, save_yaml, to_yaml

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="OLMo 3 pre-training in JAX, with parity against OLMo-core built in.")

RecipeOpt = typer.Option(None, "--recipe", help="named preset (olmax.recipes)")
ConfigOpt = typer.Option(None, "--config", help="experiment YAML instead of a recipe")
OverridesArg = typer.Argument(None, help="dotted overrides, e.g. model.n_layers=4")
JsonOpt = typer.Option(None, "--json", help="also write the figures to this JSON file")


@app.callback()
def _root() -> None:
    """OLMo 3 pre-training in JAX, with parity against OLMo-core built in."""


def _exits_on(label: str, errors: Callable[[], tuple[type[Exception], ...]]):
    """Decorator: the user errors `errors()` lists end the command with `label: message` (the message
    names the file or field) and exit status 2, not a traceback. `errors` imports them only when one
    is raised, so commands stay quick to start."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except errors() as e:
                typer.echo(f"{label}: {e}", err=True)
                raise typer.Exit(2) from None

        return wrapper

    return decorate


def write_json(path: Optional[Path], payload: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


@app.command("config")
def config_cmd(
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    save: Optional[Path] = typer.Option(None, "--save", help="write the resolved config as YAML"),
):
    """Print the resolved experiment config (a recipe or YAML file plus overrides)."""
    from olmax.recipes import resolve

    cfg = resolve(recipe, config, overrides or [])
    typer.echo(to_yaml(cfg), nl=False)
    if save is not None:
        save_yaml(cfg, save)


# -- subcommands are registered below this line --

@app.command("verify")
@_exits_on("verify error", lambda: (ValueError, FileNotFoundError))  # CheckpointError is a ValueError
def verify_cmd(
    a: Path = typer.Option(..., "--a", help="run A: a run directory (its checkpoints/) or a checkpoint directory"),
    b: Path = typer.Option(..., "--b", help="run B, in either form"),
    out: Path = typer.Option(..., "--out", help="directory for verify.md, verify.json and the PNGs"),
    landmarks: Optional[str] = typer.Option(None, "--landmarks", help="steps, e.g. 1000,5000 (default: every step both hold)"),
    data: list[str] = typer.Option(["demo:heldout"], "--data", help="held-out data for loss and KL (as `eval loss`); repeatable"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="default: the model's max_position"),
    batch: int = typer.Option(8, "--batch"),
    max_batches: Optional[int] = typer.Option(4, "--max-batches"),
    domains: Optional[str] = typer.Option(None, "--domains", help="held-out jsonl directory for per-domain loss (as `eval domains`)"),
    by: str = typer.Option("auto", "--by", help="domain grouping: auto, field or file"),
    max_docs: Optional[int] = typer.Option(None, "--max-docs", help="at most this many documents per domain"),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="comma-separated lm-eval tasks (skipped without lm-eval)"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="offline task data (as `eval tasks`)"),
    limit: Optional[int] = typer.Option(None, "--limit", help="at most this many documents per task"),
    sigmas: float = typer.Option(2.0, "--sigmas", help="verdict rule: |delta| <= this many sigma is within noise"),
    kl_floor: float = typer.Option(1.5e-3, "--kl-floor", help="mean KL (nats) at or below which KL is within noise"),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="cache for tokenized eval text"),
    json_out: Optional[Path] = JsonOpt,
):
    """Compare A and B at step-aligned landmarks on held-out loss, domains, tasks and KL: one report."""
    from olmax.evals.verify import SURFACE_NAMES, rules, verify

    report = verify(a, b, out, landmarks=[int(s) for s in landmarks.split(",") if s] if landmarks else None,
                    data=data, seq_len=seq_len, batch=batch, max_batches=max_batches, domains=domains, by=by,
                    max_docs=max_docs, tasks=[t for t in tasks.split(",") if t] if tasks else None,
                    data_dir=str(data_dir) if data_dir else None, limit=limit, sigmas=sigmas, kl_floor=kl_floor,
                    data_cfg=_eval_data_config(work_dir))
    for surface, v in report["verdicts"].items():
        typer.echo(f"{SURFACE_NAMES[surface]:24s} {v:14s} ({rules(report)[surface]})")
    if report["tasks_skipped"]:
        typer.echo(f"tasks skipped: {report['tasks_skipped']}")
    typer.echo(f"report: {out / 'verify.md'}")
    write_json(json_out, report)



@app.command("compile-check")
def compile_check_cmd(
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    devices: int = typer.Option(8, "--devices", help="fake CPU devices to compile for (ignored on accelerators)"),
    json_out: Optional[Path] = JsonOpt,
):
    """Compile the recipe's real train step with abstract arrays; print per-device memory (XLA)."""
    import os

    # Must precede the first jax import: the CPU backend reads it once.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    from olmax.compile_check import compile_report, format_report
    from olmax.recipes import resolve

    report = compile_report(resolve(recipe, config, overrides or []))
    typer.echo(format_report(report))
    write_json(json_out, report)

ckpt_app = typer.Typer(no_args_is_help=True, help="Inspect training checkpoints and warm-start new stages from them.")
app.add_typer(ckpt_app, name="ckpt")


def _checkpoint_errors():
    from olmax.checkpoint import CheckpointError

    return (CheckpointError, ConfigError)


@ckpt_app.command("warm-start")
@_exits_on("ckpt warm-start", _checkpoint_errors)
def ckpt_warm_start_cmd(
    src: Path = typer.Argument(..., help="a run's checkpoint directory (RUN_DIR/checkpoints)"),
    dst: Path = typer.Argument(..., help="new directory for the warm-start checkpoint"),
    keep: str = typer.Option("params,moments", "--keep", help="params, or params,moments (Adam moments and "
                                                             "their bias-correction counter)"),
    reset_step: bool = typer.Option(False, "--reset-step", help="step 0: restart the schedule, empty the "
                                                                "skip-step window, drop the data state"),
    step: Optional[int] = typer.Option(None, "--step", help="source step (default: the latest)"),
    json_out: Optional[Path] = JsonOpt,
):
    """Write a checkpoint for `checkpoint.init_from=DST` that keeps parameters (and Adam moments)."""
    from olmax.surgery import warm_start

    summary = warm_start(src, dst, keep=tuple(k.strip() for k in keep.split(",") if k.strip()),
                         reset_step=reset_step, step=step)
    typer.echo(f"wrote {dst} (step {summary['step']}, kept {','.join(summary['keep'])}, Adam counter "
               f"{summary['adam_count']}) from {src} step {summary['source_step']}; start the next stage "
               f"with checkpoint.init_from={dst}")
    write_json(json_out, summary)


@ckpt_app.command("inspect")
@_exits_on("ckpt inspect", _checkpoint_errors)
def ckpt_inspect_cmd(
    ckpt: Path = typer.Argument(..., help="a run's checkpoint directory (RUN_DIR/checkpoints)"),
    step: Optional[int] = typer.Option(None, "--step", help="default: the latest"),
    against: Optional[Path] = typer.Option(None, "--against", help="another checkpoint directory: show the "
                                                                    "config keys that differ"),
    json_out: Optional[Path] = JsonOpt,
):
    """Step, tokens, mesh, array shapes and dtypes, data state and config of a checkpoint."""
    from olmax.surgery import inspect

    r = inspect(ckpt, step=step, against=against)
    meta = r["meta"]
    typer.echo(f"{r['directory']} step {r['step']} (steps {r['steps']}); tokens seen {r['tokens_seen']}; "
               f"mesh {meta.get('mesh')}; olmax {meta.get('olmax_version')}")
    if "warm_start" in meta:
        typer.echo(f"warm start: {meta['warm_start']}")
    for group in ("params", "opt_state"):
        typer.echo(f"{group}:")
        for name, a in r[group].items():
            typer.echo(f"  {name:60s} {str(tuple(a['shape'])):20s} {a['dtype']}")
    typer.echo(f"data: {json.dumps(r['data'])}")
    if against is not None:
        typer.echo(f"config diff against {r['against']} (this -> other):" if r["config_diff"] else
                   f"config identical to {r['against']}")
        for key, (mine, theirs) in r["config_diff"].items():
            typer.echo(f"  {key}: {mine!r} -> {theirs!r}")
    write_json(json_out, r)



@app.command("demo")
def demo_cmd(
    run_dir: Path = typer.Option(Path("runs/demo"), "--run-dir", help="where the demo run goes"),
    overrides: Optional[list[str]] = OverridesArg,
    json_out: Optional[Path] = JsonOpt,
):
    """Train the tiny OLMo 3 on the embedded corpus (CPU), evaluate held-out loss, plot the curve."""
    from olmax.demo import format_summary, run_demo

    summary = run_demo(run_dir, overrides or [])
    typer.echo(format_summary(summary))
    write_json(json_out, summary)


@app.command("compare")
def compare_cmd(
    run_a: str = typer.Argument(..., help="run A: metrics.jsonl, a run dir (metrics.jsonl or TensorBoard events), or a W&B .csv"),
    run_b: str = typer.Argument(..., help="run B, in any of the same forms"),
    out: Path = typer.Option(..., "--out", help="directory for overlay.png, paired_diff.png, compare.md, compare.json"),
    metric: str = typer.Option("train/CE loss", "--metric", help="metric name as logged (OLMo-core W&B names)"),
    ref_csv: Optional[str] = typer.Option(None, "--ref-csv", help="W&B CSV export of a reference run, drawn and tabled too"),
    bin_size: int = typer.Option(2000, "--bin", help="steps per bin"),
    smooth: int = typer.Option(1, "--smooth", help="trailing moving average over this many bins"),
    landmarks: Optional[str] = typer.Option(None, "--landmarks", help="steps for the gap table, e.g. 1000,5000 (default: 8 spread bins)"),
    tolerance: float = typer.Option(0.0, "--tolerance", help="paired diff: largest |B - A| still counted as equal"),
    label_a: Optional[str] = typer.Option(None, "--label-a"),
    label_b: Optional[str] = typer.Option(None, "--label-b"),
    json_out: Optional[Path] = JsonOpt,
):
    """Two runs side by side: binned overlay with a gap panel, gap table at landmarks, per-step paired diff."""
    from olmax.evals.compare import compare_runs

    try:
        report = compare_runs(run_a, run_b, out, metric=metric, bin_size=bin_size, smooth=smooth,
                              landmarks=[int(x) for x in landmarks.split(",")] if landmarks else None,
                              ref_csv=ref_csv, label_a=label_a, label_b=label_b, tolerance=tolerance)
    except (ValueError, FileNotFoundError) as e:  # RunFormatError is a ValueError
        typer.echo(f"compare error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo((out / "compare.md").read_text(), nl=False)
    write_json(json_out, report)


@app.command("train")
def train_cmd(
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    run_dir: Path = typer.Option(..., "--run-dir", help="logs, config and checkpoints; rerun to resume"),
    stop_at: Optional[int] = typer.Option(None, "--stop-at", help="end after this step (with a checkpoint); "
                                                                   "the schedule's horizon is unchanged"),
    chip: Optional[str] = typer.Option(None, "--chip", help="h100, h200, v5p, v6e or ironwood: logs MFU"),
    allow_data_change: bool = typer.Option(False, "--allow-data-change",
                                           help="resume even though the data fingerprint changed"),
    allow_config_change: bool = typer.Option(False, "--allow-config-change",
                                             help="resume even though the global batch or sequence length changed"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the resolved config and exit"),
):
    """Train (or resume training) an experiment; metrics go to RUN_DIR/metrics.jsonl and TensorBoard."""
    from olmax.recipes import resolve

    cfg = resolve(recipe, config, overrides or [])
    if dry_run:
        typer.echo(to_yaml(cfg), nl=False)
        return
    from olmax.flops import resolve_peak
    from olmax.train import train

    rows = train(cfg, run_dir, stop_at=stop_at, peak_tflops=resolve_peak(None, chip),
                 allow_data_change=allow_data_change, allow_config_change=allow_config_change)
    if rows:
        typer.echo(f"steps {rows[0]['step']}..{rows[-1]['step']}: CE loss {rows[0]['train/CE loss']:.4f} -> "
                   f"{rows[-1]['train/CE loss']:.4f}; logs and checkpoints in {run_dir}")
    else:
        typer.echo(f"nothing to do: {run_dir} is already at or past the last step")


eval_app = typer.Typer(no_args_is_help=True, help="Held-out evaluation of checkpoints (docs/verification.md).")
app.add_typer(eval_app, name="eval")


def _eval_errors():
    # CheckpointError and the data errors are ValueErrors
    return (ValueError, FileNotFoundError)


_fail_on_bad_eval_input = _exits_on("eval error", _eval_errors)


def _eval_data_config(work_dir: Optional[Path]):
    from olmax.config import DataConfig

    return DataConfig(work_dir=str(work_dir) if work_dir else "")


EvalDataOpt = typer.Option(..., "--data", help="token shards, tokenize dirs, globs, demo:heldout, or .jsonl(.gz) text; repeatable")
EvalWorkDirOpt = typer.Option(None, "--work-dir", help="cache for tokenized eval text (default $OLMAX_CACHE or ~/.cache/olmax)")
EvalDtypeOpt = typer.Option(None, "--dtype", help="compute dtype (default: the checkpoint config's)")


@eval_app.command("loss")
@_fail_on_bad_eval_input
def eval_loss_cmd(
    ckpt: Path = typer.Option(..., "--ckpt", help="olmax checkpoint directory"),
    data: list[str] = EvalDataOpt,
    seq_len: int = typer.Option(8192, "--seq-len"),
    batch: int = typer.Option(8, "--batch", help="instances per eval batch (fixed whatever the device count)"),
    max_batches: Optional[int] = typer.Option(None, "--max-batches", help="at most this many batches per data spec"),
    step: Optional[int] = typer.Option(None, "--step", help="checkpoint step (default: the latest)"),
    dtype: Optional[str] = EvalDtypeOpt,
    loss_chunk: int = typer.Option(0, "--loss-chunk", help="sequence positions per output-layer chunk (0 = all)"),
    work_dir: Optional[Path] = EvalWorkDirOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Held-out CE loss on fixed, identical batches (OLMo-core's evaluator loss)."""
    from olmax.evals.heldout import eval_loss

    report = eval_loss(str(ckpt), data, seq_len=seq_len, batch=batch, max_batches=max_batches,
                       data_cfg=_eval_data_config(work_dir), step=step, compute_dtype=dtype, loss_chunk=loss_chunk)
    for name, r in report["results"].items():
        typer.echo(f"eval/{name}/CE loss {r['CE loss']:.6f}  PPL {r['PPL']:.4f}  tokens {r['tokens']}")
    write_json(json_out, report)


@eval_app.command("domains")
@_fail_on_bad_eval_input
def eval_domains_cmd(
    ckpt: Path = typer.Option(..., "--ckpt", help="olmax checkpoint directory"),
    data: Path = typer.Option(..., "--data", help="directory of held-out .jsonl(.gz) files, or one file"),
    by: str = typer.Option("auto", "--by", help="auto (the `domain` field if present, else the file), field or file"),
    seq_len: int = typer.Option(2048, "--seq-len", help="window length for long documents"),
    batch: int = typer.Option(8, "--batch"),
    max_docs: Optional[int] = typer.Option(None, "--max-docs", help="at most this many documents per domain"),
    tokenizer: str = typer.Option("dolma2", "--tokenizer", help="dolma2 or a HF tokenizer.json"),
    step: Optional[int] = typer.Option(None, "--step"),
    dtype: Optional[str] = EvalDtypeOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Per-domain loss, perplexity and bits per byte (Paloma-style), with macro and micro averages."""
    from olmax.evals.domains import eval_domains, format_domains

    report = eval_domains(str(ckpt), str(data), seq_len=seq_len, batch=batch, by=by, max_docs=max_docs,
                          tokenizer=tokenizer, step=step, compute_dtype=dtype)
    typer.echo(format_domains(report))
    write_json(json_out, report)


@eval_app.command("tasks")
@_fail_on_bad_eval_input
def eval_tasks_cmd(
    ckpt: Path = typer.Option(..., "--ckpt", help="olmax checkpoint directory"),
    tasks: str = typer.Option("mmlu,hellaswag,arc_easy,arc_challenge,openbookqa,piqa,boolq,winogrande", "--tasks",
                              help="comma-separated lm-eval task names"),
    num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", help="shots for every task (default: mmlu 5, others lm-eval's)"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="offline: DIR/<task>/<split>/*.arrow (MMLU: DIR/mmlu/<subject>/...)"),
    tokenizer: str = typer.Option("dolma2", "--tokenizer", help="dolma2 or a HF tokenizer.json"),
    batch: int = typer.Option(8, "--batch"),
    limit: Optional[int] = typer.Option(None, "--limit", help="at most this many documents per task (a smoke run)"),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="context length (default: the config's max_position)"),
    step: Optional[int] = typer.Option(None, "--step"),
    dtype: Optional[str] = EvalDtypeOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Downstream accuracy through lm-eval-harness (the `olmax` model; needs the `eval` extra)."""
    try:
        import lm_eval  # noqa: F401  (the eval extra)
    except ImportError as e:
        typer.echo(f"eval error: `olmax eval tasks` needs the eval extra (pip install -e '.[eval]'): {e}", err=True)
        raise typer.Exit(2) from None
    from olmax.evals.tasks import format_tasks, run_tasks

    report = run_tasks(str(ckpt), [t for t in tasks.split(",") if t], num_fewshot=num_fewshot,
                       data_dir=str(data_dir) if data_dir else None, tokenizer=tokenizer, batch_size=batch,
                       limit=limit, max_length=max_length, step=step, dtype=dtype)
    typer.echo(format_tasks(report))
    write_json(json_out, report)


@eval_app.command("kl")
@_fail_on_bad_eval_input
def eval_kl_cmd(
    ckpt_a: Path = typer.Option(..., "--ckpt-a", help="reference olmax checkpoint (A in KL(A||B))"),
    ckpt_b: Path = typer.Option(..., "--ckpt-b", help="olmax checkpoint compared with it"),
    data: list[str] = EvalDataOpt,
    seq_len: int = typer.Option(2048, "--seq-len"),
    batch: int = typer.Option(4, "--batch"),
    max_batches: Optional[int] = typer.Option(4, "--max-batches"),
    buckets: Optional[str] = typer.Option(None, "--buckets", help="position bucket starts, e.g. 0,128,1024 (default 0,16,64,... x4)"),
    step_a: Optional[int] = typer.Option(None, "--step-a"),
    step_b: Optional[int] = typer.Option(None, "--step-b"),
    dtype: Optional[str] = EvalDtypeOpt,
    work_dir: Optional[Path] = EvalWorkDirOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Per-token KL(A||B) (mean, median, p90, p99) and top-1 agreement, by position bucket."""
    from olmax.evals.kl import eval_kl, format_kl

    edges = [int(x) for x in buckets.split(",")] if buckets else None
    report = eval_kl(str(ckpt_a), str(ckpt_b), data, seq_len=seq_len, batch=batch, max_batches=max_batches,
                     buckets=edges, data_cfg=_eval_data_config(work_dir), step_a=step_a, step_b=step_b,
                     compute_dtype=dtype)
    typer.echo(format_kl(report))
    write_json(json_out, report)


def _checkpoint_errors():
    from olmax.checkpoint import CheckpointError
    from olmax.convert import ConversionError

    return (ConversionError, CheckpointError)


_fail_on_bad_checkpoint = _exits_on("conversion error", _checkpoint_errors)


@app.command("convert")
@_fail_on_bad_checkpoint
def convert_cmd(
    out: Path = typer.Option(..., "--out", help="the new checkpoint (olmax) or HF directory; must be new or empty"),
    from_hf: Optional[str] = typer.Option(None, "--from-hf", help="HF Olmo3ForCausalLM directory, or a hub id owner/name"),
    revision: Optional[str] = typer.Option(None, "--revision", help="with a hub id: branch, tag or commit"),
    from_olmo_core: Optional[Path] = typer.Option(
        None, "--from-olmo-core", help="OLMo-core model state: .safetensors, .pt or a distributed checkpoint dir"),
    to_hf: Optional[Path] = typer.Option(None, "--to-hf", help="olmax checkpoint to write as a HF directory"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="--to-hf weight dtype (default: the source's)"),
    step: Optional[int] = typer.Option(None, "--step", help="--to-hf checkpoint step (default: the latest)"),
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    json_out: Optional[Path] = JsonOpt,
):
    """Convert weights: HF or OLMo-core -> olmax checkpoint (step 0), or olmax -> HF.

    --from-olmo-core needs the architecture, from --recipe/--config and overrides (a state dict has none).
    """
    chosen = [name for name, value in (("--from-hf", from_hf), ("--from-olmo-core", from_olmo_core),
                                       ("--to-hf", to_hf)) if value is not None]
    if len(chosen) != 1:
        raise typer.BadParameter("give exactly one of --from-hf, --from-olmo-core, --to-hf")
    if (recipe or config or overrides) and not from_olmo_core:
        raise typer.BadParameter("--recipe/--config/overrides only apply to --from-olmo-core")
    if from_hf is not None:
        from olmax.convert.hf import convert_from_hf

        summary = convert_from_hf(from_hf, out, revision=revision)
    elif to_hf is not None:
        from olmax.convert.hf import convert_to_hf

        summary = convert_to_hf(to_hf, out, dtype=dtype, step=step)
    else:
        from olmax.convert.olmo_core import convert_from_olmo_core
        from olmax.recipes import resolve

        if not (recipe or config):
            raise typer.BadParameter("--from-olmo-core needs --recipe or --config for the architecture")
        exp = resolve(recipe, config, overrides or [])
        tokens = {"eos_token_id": exp.data.eos_token_id, "pad_token_id": exp.data.pad_token_id,
                  "bos_token_id": exp.data.bos_token_id}
        summary = convert_from_olmo_core(from_olmo_core, exp.model, out, special_tokens=tokens)
    typer.echo(" ".join(f"{k}={v}" for k, v in summary.items()))
    write_json(json_out, summary)


@app.command("parity")
@_fail_on_bad_checkpoint
def parity_cmd(
    hf: str = typer.Option(..., "--hf", help="HF Olmo3ForCausalLM directory (the reference)"),
    ckpt: Path = typer.Option(..., "--ckpt", help="olmax checkpoint (its latest step)"),
    dtype: str = typer.Option("float32", "--dtype", help="float32 or bfloat16: weights and compute on both sides"),
    seq_len: int = typer.Option(512, "--seq-len"),
    batch: int = typer.Option(1, "--batch"),
    seed: int = typer.Option(0, "--seed", help="seed of the random tokens"),
    layer_tol: Optional[float] = typer.Option(
        None, "--layer-tol", help="per-layer RMS-relative tolerance (default 1e-3 float32, 0.1 bfloat16)"),
    json_out: Optional[Path] = JsonOpt,
):
    """Logits and per-layer hidden states of olmax against transformers on the same random tokens."""
    from olmax.convert.parity import PARITY_DTYPES, run_hf_parity

    if dtype not in PARITY_DTYPES:
        raise typer.BadParameter(f"--dtype must be one of {', '.join(PARITY_DTYPES)}")
    report = run_hf_parity(hf, str(ckpt), dtype=dtype, seq_len=seq_len, batch=batch, seed=seed,
                           layer_tolerance=layer_tol)
    for key in ("kl_mean", "kl_max", "top1_agreement", "top10_overlap", "max_abs_logit_diff"):
        typer.echo(f"{key:>22} {report[key]:.6g}")
    typer.echo(f"{'first_divergent_layer':>22} {report['first_divergent_layer']} "
               f"(tolerance {report['layer_tolerance']:g} of the layer RMS)")
    typer.echo(f"{'layer_rel_diff':>22} " + " ".join(f"{x:.2e}" for x in report["layer_rel_diff"]))
    write_json(json_out, report)


def _data_errors():
    from olmax.data.order import OrderError
    from olmax.data.sources import DataSourceError
    from olmax.data.tokenize import TokenizeError
    from olmax.data.tokenizer import TokenizerError

    return (DataSourceError, TokenizeError, TokenizerError, OrderError)


_fail_on_bad_data = _exits_on("data error", _data_errors)


@app.command("tokenize")
@_fail_on_bad_data
def tokenize_cmd(
    inputs: list[Path] = typer.Argument(..., help=".jsonl / .jsonl.gz / .jsonl.zst (a `text` field) or .txt files"),
    out: Path = typer.Option(..., "--out", help="output directory for the shards and manifest.json"),
    tokenizer: str = typer.Option("dolma2", "--tokenizer", help="dolma2 or a path to a HF tokenizer.json"),
    workers: int = typer.Option(0, "--workers", help="encoding processes (0 = in this process)"),
    shard_tokens: int = typer.Option(1 << 26, "--shard-tokens", help="tokens per shard (closed at a document end)"),
    json_out: Optional[Path] = JsonOpt,
):
    """Tokenize text into raw token shards OLMo-core and olmax read (resumes an interrupted run)."""
    from olmax.data.tokenize import tokenize_files

    manifest = tokenize_files(inputs, out, tokenizer=tokenizer, workers=workers, shard_tokens=shard_tokens)
    summary = {"out": str(out), "shards": len(manifest["shards"]), "tokens": manifest["total_tokens"],
               "documents": sum(s["documents"] for s in manifest["sources"]), "dtype": manifest["dtype"]}
    typer.echo(" ".join(f"{k}={v}" for k, v in summary.items()))
    write_json(json_out, manifest)


data_app = typer.Typer(no_args_is_help=True, help="Inspect training data: order of instances, file checks.")
app.add_typer(data_app, name="data")


def _data_config(paths, seq_len, seed, max_target, vocab_size, eos, pad, mix_base, work_dir):
    from olmax.config import DataConfig

    return DataConfig(paths=tuple(paths), seq_len=seq_len, seed=seed, max_target_seq_len=max_target,
                      vocab_size=vocab_size, eos_token_id=eos, pad_token_id=pad, mix_base=mix_base,
                      work_dir=work_dir or "")


PathsOpt = typer.Option(..., "--paths", help="shards, globs, tokenize output dirs, mix files or demo (repeat the flag)")
SeqLenOpt = typer.Option(8192, "--seq-len")
MaxTargetOpt = typer.Option(None, "--max-target-seq-len", help="OLMo-core's max_target_sequence_length")
VocabOpt = typer.Option(100278, "--vocab-size", help="tokenizer vocabulary (dolma2 by default)")
EosOpt = typer.Option(100257, "--eos-id")
PadOpt = typer.Option(100277, "--pad-id")
MixBaseOpt = typer.Option(None, "--mix-base", help="base dir or URL of a mix file's paths")
WorkDirOpt = typer.Option(None, "--work-dir", help="cache for the order memmap (default ~/.cache/olmax)")


@data_app.command("order")
@_fail_on_bad_data
def data_order_cmd(
    paths: list[str] = PathsOpt,
    seq_len: int = SeqLenOpt,
    seed: int = typer.Option(34521, "--seed"),
    global_batch: int = typer.Option(..., "--global-batch-instances", help="instances per global batch"),
    epoch: int = typer.Option(1, "--epoch", help="epochs count from 1"),
    dp_size: int = typer.Option(1, "--dp-size"),
    dp_rank: Optional[int] = typer.Option(None, "--dp-rank", help="one rank only (default: all)"),
    steps: str = typer.Option("1:2", "--steps", help="a:b = steps a..b-1; step s (1-based) trains on batch s-1"),
    max_target: Optional[int] = MaxTargetOpt,
    vocab_size: int = VocabOpt,
    eos: int = EosOpt,
    pad: int = PadOpt,
    mix_base: Optional[str] = MixBaseOpt,
    work_dir: Optional[str] = WorkDirOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Which instances (file, token offset) each data-parallel rank saw at each step, as OLMo-core orders them."""
    from olmax.data.loader import order_report

    try:
        a, b = (int(x) for x in steps.split(":"))
    except ValueError:
        raise typer.BadParameter(f"--steps {steps!r} is not of the form a:b") from None
    cfg = _data_config(paths, seq_len, seed, max_target, vocab_size, eos, pad, mix_base, work_dir)
    report = order_report(cfg, global_batch, range(a, b), epoch=epoch, dp_size=dp_size, dp_rank=dp_rank)
    typer.echo(f"fingerprint {report['fingerprint']}  instances {report['instances']}  "
               f"batches/epoch {report['batches_per_epoch']}")
    for step in report["steps"]:
        for rank in step["ranks"]:
            shown = ", ".join(f"{i}@{report['files'][f].rsplit('/', 1)[-1]}:{o}"
                              for i, f, o in list(zip(rank["ids"], rank["file"], rank["offset"]))[:4])
            more = f", ... ({len(rank['ids'])} instances)" if len(rank["ids"]) > 4 else ""
            typer.echo(f"step {step['step']} (batch {step['batch']}) rank {rank['rank']}: {shown}{more}")
    write_json(json_out, report)


@data_app.command("check")
@_fail_on_bad_data
def data_check_cmd(
    paths: list[str] = PathsOpt,
    seq_len: int = SeqLenOpt,
    max_target: Optional[int] = MaxTargetOpt,
    vocab_size: int = VocabOpt,
    eos: int = EosOpt,
    pad: int = PadOpt,
    mix_base: Optional[str] = MixBaseOpt,
    work_dir: Optional[str] = WorkDirOpt,
    json_out: Optional[Path] = JsonOpt,
):
    """Read every token of every file and check sizes, headers and ids against the vocabulary."""
    from olmax.data.loader import build_source

    cfg = _data_config(paths, seq_len, 0, max_target, vocab_size, eos, pad, mix_base, work_dir)
    report = build_source(cfg).check_all()
    typer.echo(" ".join(f"{k}={v}" for k, v in report.items()))
    write_json(json_out, report)


@app.command("flops")
def flops_cmd(
    model: str = typer.Option(..., "--model", help="recipe name (olmax.recipes) whose model is counted"),
    seq_len: int = typer.Option(..., "--seq-len", help="tokens per sequence"),
    per_device_batch: int = typer.Option(..., "--per-device-batch", help="sequences per device per step"),
    devices: int = typer.Option(1, "--devices", help="JAX devices in the run (for tokens per step)"),
    peak: Optional[float] = typer.Option(None, "--peak", help="peak dense bf16 TFLOP/s per device"),
    chip: Optional[str] = typer.Option(None, "--chip", help="h100, h200, v5p, v6e or ironwood (per-device peak)"),
    step_time: Optional[float] = typer.Option(None, "--step-time", help="measured seconds per step (gives MFU)"),
    json_out: Optional[Path] = JsonOpt,
):
    """TFLOP per device per step (MaxText's convention and the exact count) and the MFU a step time implies."""
    from olmax.flops import flops_report, format_report, resolve_peak
    from olmax.recipes import get_recipe

    report = flops_report(
        get_recipe(model).model, seq_len=seq_len, per_device_batch=per_device_batch, devices=devices,
        peak_tflops=resolve_peak(peak, chip), step_time=step_time,
    )
    report = {"model": model, "chip": chip, **report}
    typer.echo(format_report(report))
    write_json(json_out, report)


def main() -> None:
    try:
        app()
    except ConfigError as e:
        typer.echo(f"config error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
