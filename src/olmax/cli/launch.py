"""`olmax launch [resume-until-done] --backend local|xpk|slurm ...` (olmax.launch, docs/launcher.md)."""

from __future__ import annotations

from typing import Optional

import typer

from olmax.cli.common import (
    AllowConfigChangeOpt,
    AllowDataChangeOpt,
    ChipOpt,
    ConfigOpt,
    RecipeOpt,
    RunDirOpt,
    StopAtOpt,
    TotalDevicesOpt,
    app,
    exits_on,
)

RESUME_WORD = "resume-until-done"


def launch_errors():
    from olmax.errors import ConfigError, LaunchError

    return (LaunchError, ConfigError)


def _print_env(value: bool) -> None:
    if value:
        from olmax.launch.env import BACKEND_VARS, RETRY_VARS, describe

        for name, variables in [*BACKEND_VARS.items(), ("resume-until-done", RETRY_VARS)]:
            typer.echo(f"{name}:\n{describe(variables)}")
        raise typer.Exit()


@app.command("launch")
@exits_on("launch error", launch_errors)
def launch_cmd(
    words: Optional[list[str]] = typer.Argument(
        None,
        help=f"optionally `{RESUME_WORD}` first (same as --resume-until-done), then dotted overrides "
        "for the trainer, e.g. trainer.max_steps=1000",
    ),
    backend: str = typer.Option("local", "--backend", help="local (a child process here), xpk (TPU on GKE) or slurm"),
    recipe: Optional[str] = RecipeOpt,
    config: Optional[str] = ConfigOpt,
    total_devices: int = TotalDevicesOpt,
    run_dir: str = RunDirOpt,
    stop_at: Optional[int] = StopAtOpt,
    chip: Optional[str] = ChipOpt,
    allow_data_change: bool = AllowDataChangeOpt,
    allow_config_change: bool = AllowConfigChangeOpt,
    env: Optional[list[str]] = typer.Option(
        None, "--env", help="KEY=VALUE in the trainer's environment (repeatable), e.g. --env LIBTPU_INIT_ARGS='...'"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the files and commands that would run, run nothing"),
    resume: bool = typer.Option(
        False, "--resume-until-done", help="resubmit from the newest complete checkpoint until the final step"
    ),
    max_retries: Optional[int] = typer.Option(
        None, "--max-retries", help="failed attempts in a row before giving up (default: $OLMAX_MAX_RETRIES or 10)"
    ),
    retry_backoff: Optional[float] = typer.Option(
        None, "--retry-backoff", help="seconds before each resubmission (default: $OLMAX_RETRY_BACKOFF_SECONDS or 300)"
    ),
    help_env: bool = typer.Option(
        False,
        "--help-env",
        is_eager=True,
        callback=_print_env,
        help="list the environment variables each backend reads, and exit",
    ),
):
    """Launch `olmax train` on this machine, a TPU slice (xpk) or a Slurm cluster, with the per-device
    batch and accumulation for --total-devices; or keep resubmitting it until it is done. --config,
    --run-dir, --stop-at, --chip and --allow-* are passed to olmax train: paths as the trainer's hosts
    see them. Exit status: olmax train's (olmax.rundir.exits); resume-until-done: 0 done, 2 not retried, the
    last failure's when out of retries, 143 stopped by a signal."""
    import os

    from olmax.launch.backends import dry_run as dry_run_text
    from olmax.launch.backends import make_backend
    from olmax.launch.plan import TrainOptions, make_plan, parse_env
    from olmax.launch.resume import launch_once, resume_until_done, retry_policy

    words = list(words or [])
    if words[:1] == [RESUME_WORD]:
        resume, words = True, words[1:]
    options = TrainOptions(config, chip, allow_data_change, allow_config_change, parse_env(env or []))
    plan = make_plan(recipe, words, run_dir, total_devices, stop_at, options)
    chosen = make_backend(backend, plan, os.environ)
    if dry_run:
        typer.echo(dry_run_text(chosen, plan, resume=resume), nl=False)
        return
    if resume:
        from olmax.checkpoint.store import complete_steps  # Orbax's list of complete steps: imported only here

        policy = retry_policy(os.environ, max_retries, retry_backoff)
        status = resume_until_done(chosen, plan, policy, complete_steps=complete_steps)
    else:
        status = launch_once(chosen, plan, hold_lock=backend == "local")
    raise typer.Exit(status)
