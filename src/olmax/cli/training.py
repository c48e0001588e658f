"""`olmax config | train | demo | flops | compile-check`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from olmax.cli.common import (
    AllowConfigChangeOpt,
    AllowDataChangeOpt,
    ChipOpt,
    ConfigOpt,
    JsonOpt,
    OverridesArg,
    RecipeOpt,
    RunDirOpt,
    SeqLenOpt,
    StopAtOpt,
    TotalDevicesOpt,
    app,
    exits_on,
    introduce_libtpu,
    resolve_experiment,
    runs_on,
    write_json,
)
from olmax.config.experiment import ExperimentConfig
from olmax.config.io import apply_overrides, explain_fields, format_explain, save_yaml, to_yaml
from olmax.errors import ConfigError
from olmax.fit import compile_cache


@app.command("config")
@runs_on("cpu")
def config_cmd(
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    save: Optional[Path] = typer.Option(
        None, "--save", help="write the resolved config as YAML to this file (printed instead when not given)"
    ),
    explain: bool = typer.Option(
        False,
        "--explain",
        help="list every field with its type, value and help; "
        "arguments without '=' keep the fields they prefix (model.rope); without "
        "--recipe/--config the values are the dataclass defaults",
    ),
):
    """Print the resolved experiment config (a recipe or YAML file plus overrides), or write it with --save.
    Exit 2 on a config the trainer would refuse (a typo, a wrong type, an impossible value)."""
    from olmax.config.recipes import resolve

    prefixes = [a for a in overrides or [] if explain and "=" not in a]
    settings = [a for a in overrides or [] if a not in prefixes]
    if explain and recipe is None and config is None:
        cfg = apply_overrides(ExperimentConfig(), settings)
    else:
        cfg = resolve(recipe, config, settings)
    if explain:
        typer.echo(format_explain(explain_fields(cfg, prefixes)), nl=False)
    elif save is None:
        typer.echo(to_yaml(cfg), nl=False)
    if save is not None:
        save_yaml(cfg, save)
        typer.echo(f"wrote the resolved config to {save}")


@app.command("train")
@runs_on("accelerator")
def train_cmd(
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    run_dir: str = RunDirOpt,
    stop_at: Optional[int] = StopAtOpt,
    chip: Optional[str] = ChipOpt,
    allow_data_change: bool = AllowDataChangeOpt,
    allow_config_change: bool = AllowConfigChangeOpt,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print the resolved config and exit (exit 2 on one the trainer would refuse)"
    ),
):
    """Train (or resume training) an experiment; metrics go to RUN_DIR/metrics.jsonl and TensorBoard.
    Exit status (olmax.rundir.exits, docs/launcher.md): 0 done, 1 crashed, 2 fix the input, 75 transient
    storage or remote error, 143 preempted (SIGTERM: saved and stopped early)."""
    from olmax.config.recipes import resolve

    cfg = resolve(recipe, config, overrides or [])
    if dry_run:
        typer.echo(to_yaml(cfg), nl=False)
        return
    import jax

    from olmax.extras import require
    from olmax.fit.chips import resolve_peak
    from olmax.rundir import paths
    from olmax.rundir.exits import RECORD_FILE, ExitStatus
    from olmax.rundir.progress import run_end_step
    from olmax.trainer.failures import record_exit, status_of
    from olmax.trainer.run import train

    try:
        if cfg.wandb.mode != "disabled":  # a missing extra named at once, not after the model and data are built
            require("wandb", f"wandb.mode={cfg.wandb.mode}")
        if jax.process_index() == 0:  # the previous trainer's record would read as this one's (olmax status)
            paths.remove(run_dir, RECORD_FILE)
        rows = train(
            cfg,
            run_dir,
            stop_at=stop_at,
            peak_tflops=resolve_peak(None, chip),
            allow_data_change=allow_data_change,
            allow_config_change=allow_config_change,
        )
    except Exception as e:  # noqa: BLE001 - every ending gets its row of the exit-status table
        status = status_of(e)
        if status is not ExitStatus.CRASHED:  # the message first: storage threads may still print noise
            typer.echo(f"train error ({status.meaning}): {e}", err=True)
        record_exit(run_dir, status, f"{type(e).__name__}: {e}")
        if status is ExitStatus.CRASHED:
            raise  # with its traceback; Python exits 1
        raise typer.Exit(status) from None
    last = run_end_step(str(run_dir), cfg, stop_at)
    status = ExitStatus.PREEMPTED if rows and last is not None and rows[-1]["step"] < last else ExitStatus.DONE
    record_exit(run_dir, status, f"stopped after step {rows[-1]['step']} of {last}" if rows else "")
    if rows:
        from olmax.trainer.metrics import loss_name

        loss = loss_name(cfg)
        typer.echo(
            f"steps {rows[0]['step']}..{rows[-1]['step']}: {loss.removeprefix('train/')} {rows[0][loss]:.4f} -> "
            f"{rows[-1][loss]:.4f}; logs and checkpoints in {run_dir}"
        )
    else:
        typer.echo(f"nothing to do: {run_dir} is already at or past the last step")
    if status is ExitStatus.PREEMPTED:
        typer.echo(f"preempted (SIGTERM): saved step {rows[-1]['step']} of {last}; rerun to resume", err=True)
        raise typer.Exit(status)


@app.command("demo")
@runs_on("accelerator")
def demo_cmd(
    run_dir: Path = typer.Option(Path("runs/demo"), "--run-dir", help="where the demo run goes"),
    overrides: Optional[list[str]] = OverridesArg,
    json_out: Optional[Path] = JsonOpt,
):
    """Train the tiny OLMo 3 on the embedded corpus (CPU), evaluate held-out loss, plot the curve.

    `olmax demo chat` continues it through post-training on the shipped chat corpus: SFT, then DPO,
    each scored on held-out prompts (olmax.demo.chat); its run dir defaults to runs/demo-chat."""
    overrides = list(overrides or [])
    if overrides[:1] == ["chat"]:
        from olmax.demo.chat import StageStopped, format_chat_summary, run_chat_demo
        from olmax.rundir.exits import ExitStatus

        chat_dir = Path("runs/demo-chat") if run_dir == Path("runs/demo") else run_dir
        try:
            summary = run_chat_demo(chat_dir, overrides[1:])
        except StageStopped as e:  # the same status as a preempted `olmax train`: rerun to resume
            typer.echo(str(e), err=True)
            raise typer.Exit(ExitStatus.PREEMPTED) from None
        typer.echo(format_chat_summary(summary))
    else:
        from olmax.demo.pretrain import format_summary, run_demo

        summary = run_demo(run_dir, overrides)
        typer.echo(format_summary(summary))
    write_json(json_out, summary)


@app.command("flops")
@runs_on("cpu")
@exits_on("flops", lambda: (ConfigError,))  # exit status 2: bad shape, unknown chip, impossible step time
def flops_cmd(
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    total_devices: int = TotalDevicesOpt,
    seq_len: Optional[int] = SeqLenOpt,
    per_device_batch: Optional[int] = typer.Option(
        None,
        "--per-device-batch",
        help="sequences per device per step (default: trainer.global_batch / --total-devices; a DPO pair is 2)",
    ),
    peak: Optional[float] = typer.Option(None, "--peak", help="peak dense bf16 TFLOP/s per device"),
    chip: Optional[str] = ChipOpt,
    step_time: Optional[float] = typer.Option(None, "--step-time", help="measured seconds per step (gives MFU)"),
    json_out: Optional[Path] = JsonOpt,
):
    """TFLOP per device per step of the experiment's model, batch and sequence length (MaxText's
    convention and the exact count), and the MFU a step time implies. Exit 2 on a step time shorter
    than the step's FLOPs allow at the peak (an MFU above 100%)."""
    from olmax.fit.chips import resolve_peak
    from olmax.fit.flops import flops_report, format_report, per_device_batch_of

    exp = resolve_experiment(recipe, config, overrides, {"data.seq_len": seq_len})
    rows, statistic = exp.rows_per_step, exp.statistic_rows_per_step
    if per_device_batch is None:
        per_device_batch = per_device_batch_of(rows, total_devices)
    # rows that only feed a statistic (kto's KL rows): the same share of a device's whole items, a forward each
    forward_only, part = divmod(per_device_batch * statistic, rows)
    if part:
        raise ConfigError(
            f"a per-device batch of {per_device_batch} sequences splits the items of trainer.objective="
            f"{exp.trainer.objective} ({rows // exp.trainer.global_batch} rows each, "
            f"{statistic // exp.trainer.global_batch} only feeding a statistic): give one of whole items"
        )
    report = flops_report(
        exp.model,
        seq_len=exp.data.seq_len,
        per_device_batch=per_device_batch - forward_only,
        forward_only_batch=forward_only,
        devices=total_devices,
        peak_tflops=resolve_peak(peak, chip),
        step_time=step_time,
    )
    report = {"recipe": recipe, "config": config, "chip": chip, **report}
    typer.echo(format_report(report))
    write_json(json_out, report)


@app.command("compile-check")
@runs_on("accelerator")
@exits_on("compile-check", lambda: (ConfigError,))  # exit status 2: unknown topology, bad mesh, does not fit
def compile_check_cmd(
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
    topology: Optional[str] = typer.Option(
        None,
        "--topology",
        help="TPU topology as libtpu names it (v5e:2x2, v5p:4x4x4, v6e:16x16, tpu7x:4x4x4) or as Cloud TPU's "
        "accelerator type (v5litepod-4, v5p-128, v6e-256, tpu7x-128), or a GPU cluster as NODESxGPUS (h100:64x8, "
        "h200:1x8, b200:2x8): compile for it with the TPU or GPU compiler",
    ),
    num_slices: int = typer.Option(1, "--num-slices", help="slices of --topology (multislice, data parallel over DCN)"),
    devices: int = typer.Option(
        8, "--devices", help="without --topology: fake CPU devices to compile for (ignored on accelerators)"
    ),
    decode: bool = typer.Option(
        False,
        "--decode",
        help="compile a GRPO recipe's rollout sampler (prefill + decode of grpo.sample_prompts prompts at "
        "its rollout shapes) instead of the train step; when it does not fit, name the grpo.sample_prompts that "
        "does (with grpo.sample_prompts=auto, the recipes': print the choice)",
    ),
    json_out: Optional[Path] = JsonOpt,
):
    """Compile the recipe's real train step with abstract arrays; print per-device memory, whether it
    fits the chip's HBM, the attention kernel calls and FLOPs. model.remat=auto (the accelerator
    recipes') is chosen first by compiling candidates; the choice is kept in data.work_dir. With
    --decode, the GRPO rollout sampler instead (olmax.rollout.compile_decode). Exit 2 when it does not fit."""
    import os

    if topology is None:
        # Must precede the first jax import: the CPU backend reads it once.
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    else:
        # the TPU compiler runs on this host from libtpu, the GPU compiler from the CUDA plugin; JAX
        # itself needs only the CPU backend (and the CUDA plugin registers only beside it)
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        introduce_libtpu(topology)
        compile_cache.disable()  # compiled for devices this host has not: nothing it could load back
    from olmax.config.recipes import resolve
    from olmax.data.loader import work_dir_of
    from olmax.fit.compile_check import check_fits, compile_report, format_report

    cfg = resolve(recipe, config, overrides or [])
    if decode:
        from olmax.rollout.compile_decode import check_decode_fits, decode_report, format_decode_report

        report = decode_report(cfg, topology=topology, num_slices=num_slices, log=typer.echo)
        typer.echo(format_decode_report(report))
        write_json(json_out, report)
        check_decode_fits(report)
        return
    # model.remat=auto's searches are kept with the other caches (data.work_dir), by what decides them
    cache = str(work_dir_of(cfg.data))
    # an RL recipe's continuous engine keeps its cache beside the step, for the slots grpo.sample_prompts
    # gives it on these devices (auto: searched by compiling the sampler, as `olmax train` does)
    from olmax.rollout.compile_decode import choose_sample_prompts
    from olmax.rollout.producer import engine_state_bytes

    def resident(c, mesh) -> int:
        if not engine_state_bytes(c, mesh):
            return 0
        return engine_state_bytes(choose_sample_prompts(c, mesh, cache, log=typer.echo, chip_flags=True), mesh)

    report = compile_report(
        cfg, topology=topology, num_slices=num_slices, cache_dir=cache, log=typer.echo, resident=resident
    )
    typer.echo(format_report(report))
    write_json(json_out, report)
    check_fits(report)
