"""`olmax eval tasks`: downstream tasks through lm-eval-harness with the `olmax` model.

The 8-task suite of the MaxText write-up: mmlu (5-shot), hellaswag, arc_easy, arc_challenge,
openbookqa, piqa, boolq, winogrande (lm-eval's default shots, 0). Any other task lm-eval knows runs
too, and so do a team's own task YAMLs from `include_path` directories (lm-eval's TaskManager).

The report has, per task, every metric lm-eval reports for it under `tasks.<name>.<metric>` (acc,
acc_norm, word_perplexity, byte_perplexity, bits_per_byte, exact_match, ...; a metric computed after
a filter other than lm-eval's "none" keeps the filter in its name, `exact_match,strict-match`) with
`<metric>_stderr` where lm-eval gives one (null where it reports "N/A"), and for generate_until tasks
the generated texts in document order under `generations.<task>`. The macro average is the
unweighted mean of the tasks' `acc`, its stderr the per-task stderrs combined in quadrature / n.
With `data_dir` every dataset comes from local copies
(olmax.evals.lm_eval_adapter.offline_datasets), so no network is needed; without it lm-eval
downloads them from the HF hub, and a task whose data cannot be reached (offline) is a
TaskDataError naming the task and the --data-dir / --include-path remedies.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional, Sequence

SUITE = ("mmlu", "hellaswag", "arc_easy", "arc_challenge", "openbookqa", "piqa", "boolq", "winogrande")
MMLU_SHOTS = 5  # mmlu and its subtasks (mmlu_anatomy, ...); everything else: lm-eval's default (0)


class TaskDataError(ValueError):
    """A task whose dataset could not be fetched from the hub and has no local copy."""

    def __init__(self, task: str, data_dir: Optional[str], cause: Exception):
        where = (
            f"{data_dir} has no copy of it (DATA_DIR/{task}/<split>/*.arrow)"
            if data_dir
            else f"give --data-dir DIR with a local copy (DIR/{task}/<split>/*.arrow)"
        )
        super().__init__(
            f"task {task}: its data could not be downloaded ({cause}); {where}, or --include-path for "
            "task YAMLs of your own that read local files"
        )


def task_figures(result: dict) -> dict:
    """lm-eval's results entry of one task ({"acc,none": .., "acc_stderr,none": .., "alias": ..}) ->
    {"acc": .., "acc_stderr": ..}: every numeric metric, named as the module doc says."""
    figures = {}
    for key, value in result.items():
        if "," not in key:
            continue  # alias, sample counts
        metric, filter_name = key.split(",", 1)
        stderr = metric.endswith("_stderr")
        base = metric[: -len("_stderr")] if stderr else metric
        name = base if filter_name == "none" else f"{base},{filter_name}"
        name = f"{name}_stderr" if stderr else name
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            figures[name] = float(value)
        elif stderr:
            figures[name] = None  # lm-eval's "N/A": no stderr for this metric
    return figures


def task_generations(out: dict) -> dict[str, list[str]]:
    """The texts each generate_until task generated, in document order (needs log_samples)."""
    generations = {}
    for task, samples in out.get("samples", {}).items():
        if out["configs"].get(task, {}).get("output_type") == "generate_until":
            generations[task] = [s["resps"][0][0] for s in sorted(samples, key=lambda s: s["doc_id"])]
    return generations


def known_tasks(tasks: Sequence[str], include_path: Sequence[str] = ()):
    """lm-eval's TaskManager over its own tasks and the `include_path` directories, once every name in
    `tasks` is found there (ValueError naming the unknown ones): what a command checks before it
    spends anything on models."""
    from lm_eval.tasks import TaskManager

    task_manager = TaskManager(include_path=list(include_path) or None)
    unknown = [t for t in tasks if t not in task_manager.all_tasks]
    if unknown:
        raise ValueError(
            f"unknown lm-eval task(s) {', '.join(unknown)}"
            + (f" (also looked in {', '.join(map(str, include_path))})" if include_path else "")
        )
    return task_manager


def evaluate_tasks(
    lm,
    tasks: Sequence[str],
    *,
    num_fewshot: Optional[int] = None,
    data_dir: Optional[str] = None,
    include_path: Sequence[str] = (),
    limit: Optional[int] = None,
    bootstrap_iters: int = 100000,
) -> dict:
    """Run lm-eval on an lm-eval model object (`OlmaxLM`, or any other, e.g. HFLM in the tests)."""
    import lm_eval

    from olmax.evals.lm_eval_adapter import offline_datasets

    task_manager = known_tasks(tasks, include_path)
    per_task, generations = {}, {}
    offline = offline_datasets(data_dir) if data_dir else contextlib.nullcontext()
    with offline:
        for task in tasks:
            shots = (
                num_fewshot
                if num_fewshot is not None
                else (MMLU_SHOTS if task == "mmlu" or task.startswith("mmlu_") else None)
            )
            try:
                out = lm_eval.simple_evaluate(
                    model=lm,
                    tasks=[task],
                    num_fewshot=shots,
                    limit=limit,
                    bootstrap_iters=bootstrap_iters,
                    log_samples=True,
                    task_manager=task_manager,
                )
            except ConnectionError as e:  # `datasets` could not download the task's data (offline)
                raise TaskDataError(task, data_dir, e) from None
            per_task[task] = {"num_fewshot": shots or 0, **task_figures(out["results"][task])}
            generations.update(task_generations(out))
    accs = [r["acc"] for r in per_task.values() if "acc" in r]
    errs = [r.get("acc_stderr") for r in per_task.values() if "acc" in r]
    macro = {
        "acc": sum(accs) / len(accs) if accs else None,
        "acc_stderr": (math.sqrt(sum(e * e for e in errs)) / len(errs)) if accs and None not in errs else None,
    }
    return {"tasks": per_task, "macro": macro, "generations": generations, "limit": limit}


def run_tasks(
    ckpt: str,
    tasks: Sequence[str],
    *,
    num_fewshot: Optional[int] = None,
    data_dir: Optional[str] = None,
    include_path: Sequence[str] = (),
    tokenizer: str = "dolma2",
    batch_size: int = 8,
    limit: Optional[int] = None,
    max_length: Optional[int] = None,
    step: Optional[int] = None,
    dtype: Optional[str] = None,
) -> dict:
    """Load an olmax checkpoint as the `olmax` lm-eval model and evaluate `tasks`."""
    from olmax.evals.lm_eval_adapter import OlmaxLM

    lm = OlmaxLM(ckpt, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length, step=step, dtype=dtype)
    report = evaluate_tasks(
        lm, tasks, num_fewshot=num_fewshot, data_dir=data_dir, include_path=include_path, limit=limit
    )
    return {"ckpt": str(ckpt), "step": lm.meta["step"], "data_dir": data_dir, **report}


def format_tasks(report: dict) -> str:
    """One row per task and metric, with its stderr; the macro average of `acc` last."""
    lines = ["| task | shots | metric | value | ± |", "|---|---:|---|---:|---:|"]
    f = lambda x: "-" if x is None else f"{x:.4f}"
    for name, r in report["tasks"].items():
        for metric, value in r.items():
            if metric != "num_fewshot" and not metric.endswith("_stderr"):
                lines.append(
                    f"| {name} | {r['num_fewshot']} | {metric} | {f(value)} | {f(r.get(metric + '_stderr'))} |"
                )
    m = report["macro"]
    lines.append(f"| **macro** | | acc | {f(m['acc'])} | {f(m['acc_stderr'])} |")
    return "\n".join(lines)
