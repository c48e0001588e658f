"""`olmax verify`: two runs (or checkpoints) compared on every held-out surface at step-aligned
landmarks, with one verdict per surface (docs/verification.md, "One report: olmax verify").

At each landmark step the checkpoints of A and B at that step are loaded once and scored on
identical inputs (A and B may also be single checkpoints, e.g. one run at two steps: then that one
pair is compared):

- held-out loss (olmax.evals.heldout's instances and loss, padded vocabulary),
- per-domain loss and bits per byte (olmax.evals.domains; only with `domains`),
- downstream tasks (olmax.evals.tasks through lm-eval, lm-eval's tasks and the task YAMLs of
  `include_path`; only with `tasks` and lm-eval installed),
- token-level KL(A || B) (olmax.evals.kl).

Deltas are B - A. Their sigma:

- Losses (held-out, domains): both models score the SAME tokens, so the difference is paired. Tokens
  of one sequence are not independent (a hard document is hard for both models), so the standard
  error is taken over clusters: held-out instances, or documents for domains. With D_i the summed
  NLL difference of cluster i and n_i its scored tokens, delta = sum D_i / sum n_i and
  sigma^2 = m/(m-1) * sum (D_i - delta n_i)^2 / (sum n_i)^2 over the m clusters (the cluster-robust
  standard error of a ratio; with one token per cluster it is the plain standard error of the mean
  per-token difference). Fewer than two clusters give no sigma and the verdict "undetermined".
- Tasks: lm-eval's stderr of A and B combined in quadrature, per task and for the macro average
  (this ignores that both models answer the same questions, so it is conservative).
- KL has no null of zero noise to test against: KL(A || B) >= 0, exactly 0 for identical functions.
  Its verdict compares the mean KL with a floor (default 1.5e-3 nats: the framework noise floor of a
  converted checkpoint in bf16 at 8192 tokens, docs/reference.md).

A landmark is "within noise" on a surface when |delta| <= k sigma (k = `sigmas`, default 2), or
mean KL <= floor; a surface's verdict is "differs" when any landmark differs. The domain surface
tests the pooled (micro) loss delta; per-domain rows are flagged but do not vote (16 domains at 2
sigma would flag one by chance in half of all comparisons of identical runs).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from jax.sharding import Mesh

from olmax.checkpoint.inference import eval_mesh, load_checkpoint
from olmax.checkpoint.store import checkpoint_path, complete_steps
from olmax.config.data import DataConfig
from olmax.evals.domains import read_domains, score_domains
from olmax.evals.heldout import labels_for, load_instances
from olmax.evals.kl import token_kl
from olmax.evals.scoring import TokenScorer, eval_seq_len
from olmax.extras import require

KL_FLOOR = 1.5e-3
WITHIN, DIFFERS, UNDETERMINED = "within noise", "differs", "undetermined"


def checkpoint_source(path: str | Path) -> tuple[str, Optional[int]]:
    """(checkpoint directory, None) for a run directory or its `checkpoints/`; (checkpoint directory,
    step) for one checkpoint, i.e. a step sub-directory such as `run/checkpoints/40`. Local or gs://."""
    path = checkpoint_path(path)
    if path.name.isdigit() and int(path.name) in complete_steps(path.parent):
        return str(path.parent), int(path.name)
    if (path / "checkpoints").is_dir():
        path = path / "checkpoints"
    if not complete_steps(path):
        raise FileNotFoundError(
            f"{path} is neither a run directory with checkpoints/, a checkpoint directory "
            f"(step sub-directories) nor one step of one"
        )
    return str(path), None


def resolve_landmarks(
    ckpt_a: str,
    ckpt_b: str,
    landmarks: Optional[Sequence[int]],
    step_a: Optional[int] = None,
    step_b: Optional[int] = None,
) -> list[tuple[int, int]]:
    """The (A step, B step) pairs to compare. Runs: the requested steps, each present in both (default:
    every step both hold). A single checkpoint on one side fixes the step on both; single checkpoints
    on both sides are compared as given, whatever their steps (e.g. one run at two steps)."""
    if step_a is not None or step_b is not None:
        if landmarks is not None:
            raise ValueError("--landmarks applies to runs; A or B is a single checkpoint (a step directory)")
        if step_a is not None and step_b is not None:
            return [(step_a, step_b)]
        landmarks = [step_a if step_a is not None else step_b]
    steps_a, steps_b = complete_steps(ckpt_a), complete_steps(ckpt_b)
    if landmarks is None:
        common = sorted(set(steps_a) & set(steps_b))
        if not common:
            raise ValueError(f"{ckpt_a} (steps {steps_a}) and {ckpt_b} (steps {steps_b}) share no step")
        return [(s, s) for s in common]
    for name, ckpt, steps in (("A", ckpt_a, steps_a), ("B", ckpt_b, steps_b)):
        missing = [s for s in landmarks if s not in steps]
        if missing:
            raise ValueError(
                f"landmark steps {missing} are not in {name} = {ckpt} (it has steps {steps}); "
                f"train with checkpoint.keep large enough to keep them"
            )
    return [(s, s) for s in sorted(set(landmarks))]


def paired_delta(nll_a: np.ndarray, nll_b: np.ndarray, tokens: np.ndarray) -> dict:
    """Per-token losses of A and B, their delta B - A and its cluster-robust sigma (module doc).
    Each argument has one entry per cluster: summed NLLs and scored tokens."""
    nll_a, nll_b, n = (np.asarray(x, np.float64) for x in (nll_a, nll_b, tokens))
    total = n.sum()
    diff = nll_b - nll_a
    delta = float(diff.sum() / total)
    m = diff.size
    sigma = float(math.sqrt(m / (m - 1) * np.sum((diff - delta * n) ** 2)) / total) if m >= 2 else None
    return {
        "a": float(nll_a.sum() / total),
        "b": float(nll_b.sum() / total),
        "delta": delta,
        "sigma": sigma,
        "clusters": int(m),
        "tokens": int(total),
    }


def verdict(delta: float, sigma: Optional[float], k: float) -> str:
    if sigma is None or not math.isfinite(sigma):
        return UNDETERMINED
    return WITHIN if abs(delta) <= k * sigma else DIFFERS


def instance_nll(scorer: TokenScorer, params: dict, instances: np.ndarray, batch: int) -> np.ndarray:
    """(instances,) float64: each held-out instance's summed NLL (heldout_loss, kept per instance)."""
    sums = []
    for start in range(0, instances.shape[0], batch):
        tokens = instances[start : start + batch]
        nll, _ = scorer(params, tokens, labels_for(tokens))
        sums.append(np.sum(nll, axis=1, dtype=np.float64))
    return np.concatenate(sums)


def document_scores(
    scorer: TokenScorer, params: dict, domains: dict[str, list[str]], *, seq_len: int, batch: int, tokenizer: str
) -> dict[tuple[str, int], dict]:
    """{(domain, index): {"nll", "tokens", "bytes"}}: score_domains with every document its own group,
    so batching and windowing are exactly those of `olmax eval domains`."""
    docs = {(d, i): [text] for d, texts in domains.items() for i, text in enumerate(texts)}
    scored = score_domains(scorer, params, docs, seq_len=seq_len, batch=batch, tokenizer=tokenizer)["domains"]
    return {
        key: {"nll": r["loss"] * r["tokens"], "tokens": r["tokens"], "bytes": r["bytes"]} for key, r in scored.items()
    }


def compare_domains(docs_a: dict, docs_b: dict, k: float) -> dict:
    """Per-domain and pooled (micro) paired loss deltas, plus bits per byte of A and B."""

    def figures(keys):
        a = np.array([docs_a[key]["nll"] for key in keys])
        b = np.array([docs_b[key]["nll"] for key in keys])
        n = np.array([docs_a[key]["tokens"] for key in keys])
        n_bytes = sum(docs_a[key]["bytes"] for key in keys)
        r = paired_delta(a, b, n)
        r["bpb_a"], r["bpb_b"] = a.sum() / (math.log(2) * n_bytes), b.sum() / (math.log(2) * n_bytes)
        r["verdict"] = verdict(r["delta"], r["sigma"], k)
        return r

    names = sorted({d for d, _ in docs_a})
    per_domain = {d: figures([key for key in docs_a if key[0] == d]) for d in names}
    return {"domains": per_domain, "micro": figures(list(docs_a))}


def compare_tasks(tasks_a: dict, tasks_b: dict, k: float) -> dict:
    """Accuracy deltas per task and for the macro average, stderrs in quadrature."""

    def row(ra: dict, rb: dict) -> dict:
        ea, eb = ra.get("acc_stderr"), rb.get("acc_stderr")
        sigma = math.sqrt(ea * ea + eb * eb) if ea is not None and eb is not None else None
        delta = rb["acc"] - ra["acc"]
        return {"a": ra["acc"], "b": rb["acc"], "delta": delta, "sigma": sigma, "verdict": verdict(delta, sigma, k)}

    per_task = {
        t: row(tasks_a["tasks"][t], tasks_b["tasks"][t]) for t in tasks_a["tasks"] if "acc" in tasks_a["tasks"][t]
    }
    return {"tasks": per_task, "macro": row(tasks_a["macro"], tasks_b["macro"])}


def verify(
    a: str | Path,
    b: str | Path,
    out: str | Path,
    *,
    landmarks: Optional[Sequence[int]] = None,
    data: Sequence[str] = ("demo:heldout",),
    seq_len: Optional[int] = None,
    batch: int = 8,
    max_batches: Optional[int] = 4,
    domains: Optional[str] = None,
    by: str = "auto",
    max_docs: Optional[int] = None,
    tasks: Optional[Sequence[str]] = None,
    data_dir: Optional[str] = None,
    include_path: Sequence[str] = (),
    limit: Optional[int] = None,
    tokenizer: str = "dolma2",
    sigmas: float = 2.0,
    kl_floor: float = KL_FLOOR,
    data_cfg: Optional[DataConfig] = None,
    mesh: Optional[Mesh] = None,
) -> dict:
    """Score A and B at each landmark on every surface, write verify.md, verify.json and the PNGs
    into `out`, and return the report (see the module doc)."""
    if sigmas <= 0 or kl_floor < 0:
        raise ValueError(f"--sigmas must be positive and --kl-floor non-negative, got {sigmas} and {kl_floor}")
    (ckpt_a, step_a), (ckpt_b, step_b) = checkpoint_source(a), checkpoint_source(b)
    pairs = resolve_landmarks(ckpt_a, ckpt_b, landmarks, step_a, step_b)
    mesh = mesh or eval_mesh()
    text_domains = read_domains(domains, by, max_docs) if domains else None
    if tasks:  # before any scoring: asked-for tasks that cannot run end the command, not a skip
        require("lm_eval", "verify --tasks")
        from olmax.evals.tasks import known_tasks

        known_tasks(tasks, include_path)
    # one compiled forward pass per (model config, vocab choice)
    scorer = functools.cache(lambda cfg, real_vocab: TokenScorer(cfg, mesh, real_vocab=real_vocab))

    rows, instances = [], None
    for step, step_b in pairs:
        params_a, cfg_a, _ = load_checkpoint(ckpt_a, mesh, step=step)
        params_b, cfg_b, _ = load_checkpoint(ckpt_b, mesh, step=step_b)
        if instances is None:
            length = eval_seq_len(seq_len, ckpt_a, step, cfg_a)
            eval_seq_len(length, ckpt_b, step_b, cfg_b)
            instances = load_instances(
                list(data), replace(data_cfg or DataConfig(), seq_len=length), batch=batch, max_batches=max_batches
            )
        n = np.full(instances.shape[0], instances.shape[1] - 1)
        heldout = paired_delta(
            instance_nll(scorer(cfg_a, False), params_a, instances, batch),
            instance_nll(scorer(cfg_b, False), params_b, instances, batch),
            n,
        )
        heldout["verdict"] = verdict(heldout["delta"], heldout["sigma"], sigmas)
        kl = _kl_summary(token_kl(params_a, cfg_a, params_b, cfg_b, instances, batch=batch, mesh=mesh), kl_floor)
        row = {"step": step, "step_b": step_b, "heldout": heldout, "kl": kl}
        if text_domains is not None:
            score = lambda p, c: document_scores(
                scorer(c, True),
                p,
                text_domains,
                seq_len=instances.shape[1],  # noqa: B023 - score runs within this iteration
                batch=batch,
                tokenizer=tokenizer,
            )
            row["domains"] = compare_domains(score(params_a, cfg_a), score(params_b, cfg_b), sigmas)
        del params_a, params_b
        if tasks:
            options = dict(data_dir=data_dir, include_path=include_path, tokenizer=tokenizer, batch_size=batch)
            options.update(limit=limit, max_length=instances.shape[1])
            row["tasks"] = compare_tasks(
                _run_tasks(ckpt_a, step, tasks, options), _run_tasks(ckpt_b, step_b, tasks, options), sigmas
            )
        rows.append(row)

    report = {
        "a": str(ckpt_a),
        "b": str(ckpt_b),
        "landmarks": [r["step"] for r in rows],
        "landmarks_b": [r["step_b"] for r in rows],
        "data": list(data),
        "seq_len": int(instances.shape[1]),
        "instances": int(instances.shape[0]),
        "domains_data": domains,
        "tasks": list(tasks or []),
        "limit": limit,
        "sigmas": sigmas,
        "kl_floor": kl_floor,
        "rows": rows,
    }
    report["verdicts"] = {
        surface: surface_verdict([_headline(r[surface])["verdict"] for r in rows])
        for surface in SURFACE_NAMES
        if surface in rows[0]
    }
    write_report(report, Path(out))
    return report


def _kl_summary(kl: dict, kl_floor: float) -> dict:
    """The token-level KL figures verify reports, with their verdict against `kl_floor`."""
    keys = ("tokens", "kl_mean", "kl_median", "kl_p90", "kl_p99", "kl_max", "top1_agreement")
    out = {key: kl[key] for key in keys}
    out["verdict"] = WITHIN if out["kl_mean"] <= kl_floor else DIFFERS
    return out


def _run_tasks(ckpt, step: int, tasks: Sequence[str], options: dict) -> dict:
    """lm-eval's tasks on one checkpoint's step (olmax.evals.tasks)."""
    from olmax.evals.tasks import run_tasks

    return run_tasks(str(ckpt), list(tasks), step=step, **options)


def _headline(surface_row: dict) -> dict:
    """The figure a surface votes with: domains their micro row, tasks their macro row."""
    return surface_row.get("micro") or surface_row.get("macro") or surface_row


def surface_verdict(per_landmark: Sequence[str]) -> str:
    if DIFFERS in per_landmark:
        return DIFFERS
    return UNDETERMINED if UNDETERMINED in per_landmark else WITHIN


SURFACE_NAMES = {
    "heldout": "held-out loss",
    "domains": "domain loss (micro)",
    "tasks": "task accuracy (macro)",
    "kl": "token KL(A||B)",
}


def rules(report: dict) -> dict[str, str]:
    k = f"{report['sigmas']:g}"
    return {
        "heldout": f"|delta| <= {k} sigma; sigma = cluster-robust SE of the paired per-token loss difference over "
        f"the {report['instances']} held-out instances",
        "domains": f"|delta micro| <= {k} sigma; sigma = cluster-robust SE over documents (per-domain rows are "
        f"flagged with * but do not vote)",
        "tasks": f"|delta macro acc| <= {k} sigma; sigma = the A and B stderrs (lm-eval) in quadrature",
        "kl": f"mean KL(A||B) <= {report['kl_floor']:g} nats (the bf16 framework noise floor)",
    }


def _step_label(row: dict) -> str:
    return str(row["step"]) if row["step_b"] == row["step"] else f"{row['step']} vs {row['step_b']}"


def _pm(r: dict, fmt: str = ".4f") -> str:
    sigma = "n/a" if r["sigma"] is None else format(r["sigma"], fmt)
    return f"{r['delta']:+{fmt}} ± {sigma}"


def format_report(report: dict) -> str:
    rows, rule = report["rows"], rules(report)
    lines = [
        "# olmax verify",
        "",
        f"- A: `{report['a']}`",
        f"- B: `{report['b']}`",
        f"- landmarks (steps; 'A vs B' where they differ): {', '.join(_step_label(r) for r in rows)}",
        f"- held-out data: {', '.join(report['data'])} ({report['instances']} instances x {report['seq_len']} tokens)",
        "- deltas are B - A, shown as delta ± sigma",
        "",
        "## Verdicts",
        "",
        "| surface | verdict | rule |",
        "|---|---|---|",
    ]
    cell = lambda text: text.replace("|", "\\|")  # a bare | would split the markdown cell
    lines += [f"| {cell(SURFACE_NAMES[s])} | **{v}** | {cell(rule[s])} |" for s, v in report["verdicts"].items()]
    lines += [
        "",
        "## Held-out loss (nats/token) and token KL",
        "",
        "| step | A | B | delta ± sigma | verdict | KL mean | KL p99 | top-1 agree | KL verdict |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        h, kl = r["heldout"], r["kl"]
        lines.append(
            f"| {_step_label(r)} | {h['a']:.4f} | {h['b']:.4f} | {_pm(h)} | {h['verdict']} | {kl['kl_mean']:.3e} | "
            f"{kl['kl_p99']:.3e} | {kl['top1_agreement']:.4f} | {kl['verdict']} |"
        )
    if "domains" in rows[0]:
        lines += [
            "",
            f"## Per-domain loss (nats/token; `{report['domains_data']}`)",
            "",
            "| step | domain | A | B | delta ± sigma | bpb A | bpb B |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            entries = list(r["domains"]["domains"].items()) + [("**micro**", r["domains"]["micro"])]
            for name, d in entries:
                flag = " *" if d["verdict"] == DIFFERS else ""
                lines.append(
                    f"| {_step_label(r)} | {name}{flag} | {d['a']:.4f} | {d['b']:.4f} | {_pm(d)} | "
                    f"{d['bpb_a']:.4f} | {d['bpb_b']:.4f} |"
                )
    if "tasks" in rows[0]:
        limit = f", --limit {report['limit']}" if report["limit"] else ""
        lines += [
            "",
            f"## Task accuracy (lm-eval{limit})",
            "",
            "| step | task | A | B | delta ± sigma | verdict |",
            "|---:|---|---:|---:|---:|---|",
        ]
        for r in rows:
            for name, t in list(r["tasks"]["tasks"].items()) + [("**macro**", r["tasks"]["macro"])]:
                lines.append(f"| {_step_label(r)} | {name} | {t['a']:.4f} | {t['b']:.4f} | {_pm(t)} | {t['verdict']} |")
    lines += [
        "",
        "Figures: `deltas.png` (delta ± k sigma per surface and step; KL against its floor)"
        + (", `domains.png` (per-domain deltas)." if "domains" in rows[0] else "."),
    ]
    return "\n".join(lines) + "\n"


def plot_deltas(path: Path, report: dict) -> None:
    """One panel per surface: delta ± k sigma against the step (KL: its mean against the floor)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training hosts
    import matplotlib.pyplot as plt

    rows, k = report["rows"], report["sigmas"]
    steps = [r["step"] for r in rows]
    surfaces = [s for s in SURFACE_NAMES if s in rows[0]]
    fig, axes = plt.subplots(1, len(surfaces), figsize=(4.2 * len(surfaces), 3.6), squeeze=False)
    for ax, surface in zip(axes[0], surfaces):
        if surface == "kl":
            ax.plot(steps, [r["kl"]["kl_mean"] for r in rows], "o-", label="mean KL(A||B)")
            ax.axhline(report["kl_floor"], color="red", lw=0.8, ls="--", label="floor")
            ax.set_ylabel("nats")
            ax.legend()
        else:
            heads = [_headline(r[surface]) for r in rows]
            err = [k * h["sigma"] if h["sigma"] is not None else 0.0 for h in heads]
            ax.errorbar(steps, [h["delta"] for h in heads], yerr=err, fmt="o-", capsize=4)
            ax.axhline(0.0, color="gray", lw=0.8)
            ax.set_ylabel(f"B - A (± {k:g} sigma)")
        ax.set_title(f"{SURFACE_NAMES[surface]}: {report['verdicts'][surface]}", fontsize=10)
        ax.set_xlabel("step (of A)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_domains(path: Path, report: dict) -> None:
    """Per-domain loss delta ± k sigma, one marker series per landmark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, k = report["rows"], report["sigmas"]
    names = list(rows[0]["domains"]["domains"])
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(names) + 2), 4))
    for i, r in enumerate(rows):
        d = [r["domains"]["domains"][n] for n in names]
        offset = (i - (len(rows) - 1) / 2) * 0.8 / max(len(rows), 1)
        ax.errorbar(
            x + offset,
            [e["delta"] for e in d],
            fmt="o",
            capsize=3,
            label=f"step {_step_label(r)}",
            yerr=[k * e["sigma"] if e["sigma"] is not None else 0.0 for e in d],
        )
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_xticks(x, names, rotation=45, ha="right")
    ax.set_ylabel(f"loss B - A (nats/token, ± {k:g} sigma)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (out / "verify.md").write_text(format_report(report))
    plot_deltas(out / "deltas.png", report)
    if "domains" in report["rows"][0]:
        plot_domains(out / "domains.png", report)
