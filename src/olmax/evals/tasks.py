"""`olmax eval tasks`: downstream accuracy through lm-eval-harness with the `olmax` model.

The 8-task suite of the MaxText write-up: mmlu (5-shot), hellaswag, arc_easy, arc_challenge,
openbookqa, piqa, boolq, winogrande (lm-eval's default shots, 0). Per task: accuracy (`acc`, and
`acc_norm` where the task defines it) with lm-eval's bootstrap/closed-form stderr; the macro average is
the unweighted mean of the tasks' `acc`, its stderr the per-task stderrs combined in quadrature / n.
With `data_dir` every dataset comes from local copies (olmax.evals.lm_eval_adapter.offline_datasets),
so no network is needed.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional, Sequence

SUITE = ("mmlu", "hellaswag", "arc_easy", "arc_challenge", "openbookqa", "piqa", "boolq", "winogrande")
MMLU_SHOTS = 5  # mmlu and its subtasks (mmlu_anatomy, ...); everything else: lm-eval's default (0)


def _task_figures(results: dict, task: str) -> dict:
    r = results[task]
    figures = {}
    for metric in ("acc", "acc_norm"):
        key = f"{metric},none"
        if key in r:
            figures[metric] = float(r[key])
            stderr = r.get(f"{metric}_stderr,none")
            figures[f"{metric}_stderr"] = float(stderr) if isinstance(stderr, (int, float)) else None
    return figures


def evaluate_tasks(lm, tasks: Sequence[str], *, num_fewshot: Optional[int] = None, data_dir: Optional[str] = None,
                   limit: Optional[int] = None, bootstrap_iters: int = 100000) -> dict:
    """Run lm-eval on an lm-eval model object (`OlmaxLM`, or any other, e.g. HFLM in the tests)."""
    import lm_eval

    from olmax.evals.lm_eval_adapter import offline_datasets

    per_task = {}
    offline = offline_datasets(data_dir) if data_dir else contextlib.nullcontext()
    with offline:
        for task in tasks:
            shots = num_fewshot if num_fewshot is not None else (
                MMLU_SHOTS if task == "mmlu" or task.startswith("mmlu_") else None)
            out = lm_eval.simple_evaluate(model=lm, tasks=[task], num_fewshot=shots, limit=limit,
                                          bootstrap_iters=bootstrap_iters, log_samples=False)
            per_task[task] = {"num_fewshot": shots or 0, **_task_figures(out["results"], task)}
    accs = [r["acc"] for r in per_task.values() if "acc" in r]
    errs = [r.get("acc_stderr") for r in per_task.values() if "acc" in r]
    macro = {"acc": sum(accs) / len(accs) if accs else None,
             "acc_stderr": (math.sqrt(sum(e * e for e in errs)) / len(errs)) if accs and None not in errs else None}
    return {"tasks": per_task, "macro": macro, "limit": limit}


def run_tasks(ckpt: str, tasks: Sequence[str], *, num_fewshot: Optional[int] = None, data_dir: Optional[str] = None,
              tokenizer: str = "dolma2", batch_size: int = 8, limit: Optional[int] = None,
              max_length: Optional[int] = None, step: Optional[int] = None, dtype: Optional[str] = None) -> dict:
    """Load an olmax checkpoint as the `olmax` lm-eval model and evaluate `tasks`."""
    from olmax.evals.lm_eval_adapter import OlmaxLM

    lm = OlmaxLM(ckpt, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length, step=step, dtype=dtype)
    report = evaluate_tasks(lm, tasks, num_fewshot=num_fewshot, data_dir=data_dir, limit=limit)
    return {"ckpt": str(ckpt), "step": lm.meta["step"], "data_dir": data_dir, **report}


def format_tasks(report: dict) -> str:
    lines = ["| task | shots | acc | ± | acc_norm | ± |", "|---|---:|---:|---:|---:|---:|"]
    f = lambda x: "-" if x is None else f"{x:.4f}"
    for name, r in report["tasks"].items():
        lines.append(f"| {name} | {r['num_fewshot']} | {f(r.get('acc'))} | {f(r.get('acc_stderr'))} | "
                     f"{f(r.get('acc_norm'))} | {f(r.get('acc_norm_stderr'))} |")
    m = report["macro"]
    lines.append(f"| **macro** | | {f(m['acc'])} | {f(m['acc_stderr'])} | | |")
    return "\n".join(lines)
