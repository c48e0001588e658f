"""`olmax status RUN_DIR [--follow] [--json FILE]` (olmax.rundir.report)."""

from __future__ import annotations

from typing import Optional

import typer

from olmax.cli.common import ChipOpt, app, exits_on, runs_on


def status_errors():
    from olmax.errors import ConfigError

    return (ConfigError, FileNotFoundError)


@app.command("status")
@runs_on("cpu")
@exits_on("status error", status_errors)
def status_cmd(
    run_dir: str = typer.Argument(..., help="the run directory (a path or gs://...)"),
    chip: Optional[str] = ChipOpt,
    follow: bool = typer.Option(
        False,
        "--follow",
        help="refresh every --every seconds until the run has ended (its trainer exited DONE or USER_ERROR) or Ctrl-C",
    ),
    every: float = typer.Option(30.0, "--every", help="seconds between refreshes with --follow"),
    window: int = typer.Option(50, "--window", help="recent steps the step time, tokens/s, MFU and loss use"),
    json_out: Optional[str] = typer.Option(
        None, "--json", help="also write the status as JSON to this file ('-': print JSON instead of text)"
    ),
):
    """Where a run stands: step, tokens, speed, MFU, ETA, loss, skipped steps, newest checkpoint, data
    fingerprint, the launcher's retries and the last failure. --chip gives the MFU of a run whose
    trainer was not given --chip. --follow stops by itself once the run has ended for good; after a
    preemption or a crash it keeps following, since a launcher may resubmit."""
    import json
    import time
    from pathlib import Path

    from olmax.fit.chips import chip_peak
    from olmax.rundir.report import MetricsReader, format_status, has_ended, run_status

    reader = MetricsReader(run_dir, window)
    peak = chip_peak(chip) if chip is not None else None
    while True:
        status = run_status(run_dir, reader, peak_tflops=peak)
        if json_out == "-":
            typer.echo(json.dumps(status, sort_keys=True))
        else:
            typer.echo(format_status(status))
            if json_out is not None:
                Path(json_out).write_text(json.dumps(status, indent=2, sort_keys=True) + "\n")
        if not follow:
            return
        if has_ended(status):
            if json_out != "-":
                typer.echo(f"the run has ended ({status['last_exit']['name']}): no longer following")
            return
        time.sleep(every)
        if json_out != "-":
            typer.echo("")
