"""Held-out loss: forward-only cross-entropy on fixed, identical batches (docs/verification.md).

The eval set is the first `max_batches * batch` instances, in file order and unshuffled, of
anything `data.paths` accepts: token shards, `olmax tokenize` directories, globs, mix files,
`demo:heldout`, or jsonl text (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`), which is first tokenized with
data.tokenizer (dolma2) into the olmax cache (olmax.data.tokenize.cached_text), so text and shards
are read and cut into instances by the code the training loader uses. Two runs, two checkpoints, or
one run on 1 and on 64 devices therefore score exactly the same tokens.

The figure is OLMo-core's evaluator loss: labels shifted left, the last position ignored, the sum of
per-token cross-entropies over the padded vocabulary divided by the number of scored labels
(olmax.objectives.cross_entropy). Per-token values are summed on the host in float64 in a fixed order, so the result
does not depend on the device count (tests/evals/test_evals_heldout.py checks 1 against 8 devices).

In the training loop: `HeldoutEvaluator(exp_cfg, mesh)`; calling it with (step, params) every
`eval.every` steps returns `{"eval/<name>/CE loss": ..., "eval/<name>/PPL": ...}` for each
`eval.data` entry, the metric names OLMo-core's LM evaluator logs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np
from jax.sharding import Mesh

from olmax.checkpoint.inference import eval_mesh, load_checkpoint
from olmax.config.data import DataConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.model import ModelConfig
from olmax.data.loader import build_source
from olmax.data.tokenize import TEXT_SUFFIXES
from olmax.evals.scoring import OUTPUT_CHUNK, TokenScorer, eval_seq_len
from olmax.objectives.cross_entropy import IGNORE


def eval_name(spec: str) -> str:
    """A short metric-safe name for a data spec: `demo:heldout` -> demo-heldout, a/b/c4.val.jsonl.gz -> c4.val."""
    base = spec.rstrip("/").split("/")[-1]
    for suffix in TEXT_SUFFIXES + (".npy",):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-") or "heldout"


def load_instances(
    specs: Sequence[str], data_cfg: DataConfig, *, batch: int, max_batches: Optional[int] = None
) -> np.ndarray:
    """(n_batches * batch, seq_len) int32: the fixed eval instances of `specs` (see the module doc).
    The tail that does not fill a whole batch is dropped, as the training loader drops it."""
    if batch <= 0:
        raise ValueError(f"eval batch size must be positive, got {batch}")
    source = build_source(data_cfg, specs)
    n_batches = len(source) // batch
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    if n_batches == 0:
        raise ValueError(
            f"eval data {list(specs)} has {len(source)} instances of {data_cfg.seq_len} tokens: "
            f"not one batch of {batch}; lower --batch or --seq-len"
        )
    return np.stack([source[i] for i in range(n_batches * batch)]).astype(np.int32)


def labels_for(tokens: np.ndarray) -> np.ndarray:
    """OLMo-core's labels (olmax.objectives.cross_entropy.make_labels without masking), on the host."""
    return np.concatenate([tokens[:, 1:], np.full((tokens.shape[0], 1), IGNORE, np.int32)], axis=1)


def heldout_loss(scorer: TokenScorer, params: dict, instances: np.ndarray, batch: int) -> dict:
    """CE loss (nats per scored token), PPL and counts over `instances`, scored `batch` rows at a time."""
    total, count = 0.0, 0
    for start in range(0, instances.shape[0], batch):
        tokens = instances[start : start + batch]
        labels = labels_for(tokens)
        nll, _ = scorer(params, tokens, labels)
        total += float(np.sum(nll, dtype=np.float64))
        count += int(np.sum(labels != IGNORE))
    loss = total / count
    return {
        "CE loss": loss,
        "PPL": math.exp(loss),
        "tokens": count,
        "instances": int(instances.shape[0]),
        "batches": -(-instances.shape[0] // batch),
        "nll_sum": total,
    }


def eval_loss(
    ckpt: str,
    specs: Sequence[str],
    *,
    seq_len: Optional[int],
    batch: int,
    max_batches: Optional[int],
    data_cfg: Optional[DataConfig] = None,
    step: Optional[int] = None,
    compute_dtype: Optional[str] = None,
    loss_chunk: int = OUTPUT_CHUNK,
    mesh: Optional[Mesh] = None,
) -> dict:
    """`olmax eval loss`: the held-out loss of a checkpoint on each data spec, one figure per spec.
    seq_len None: the checkpoint's own training length (olmax.evals.scoring.eval_seq_len)."""
    mesh = mesh or eval_mesh()
    params, cfg, meta = load_checkpoint(ckpt, mesh, step=step, compute_dtype=compute_dtype)
    seq_len = eval_seq_len(seq_len, ckpt, meta["step"], cfg)
    data_cfg = replace(data_cfg or DataConfig(), seq_len=seq_len)
    scorer = TokenScorer(cfg, mesh, real_vocab=False, chunk=loss_chunk)
    results = {}
    for spec in specs:
        instances = load_instances([spec], data_cfg, batch=batch, max_batches=max_batches)
        results[eval_name(spec)] = {"data": spec, **heldout_loss(scorer, params, instances, batch)}
    return {
        "ckpt": str(ckpt),
        "step": meta.get("step", step),
        "seq_len": seq_len,
        "batch": batch,
        "devices": mesh.size,
        "compute_dtype": cfg.compute_dtype,
        "results": results,
    }


@dataclass
class _EvalSet:
    name: str
    instances: np.ndarray


class HeldoutEvaluator:
    """In-loop held-out loss for the trainer: built once (the eval instances are read and the forward
    pass compiled once), then `evaluator(step, params)` returns the `eval/<name>/...` metrics when
    `step` is a multiple of `eval.every`, and {} otherwise.

    The eval batch is `trainer.global_batch` instances at `data.seq_len`, `eval.batches` batches per
    set; the parameters are the live, sharded training parameters (no copy is made).
    """

    def __init__(self, exp_cfg: ExperimentConfig, mesh: Mesh, model_cfg: Optional[ModelConfig] = None):
        self.every = exp_cfg.eval.every
        self.batch = exp_cfg.trainer.global_batch
        self.scorer = TokenScorer(model_cfg or exp_cfg.model, mesh, real_vocab=False, chunk=exp_cfg.trainer.loss_chunk)
        self.sets = [
            _EvalSet(
                eval_name(spec),
                load_instances([spec], exp_cfg.data, batch=self.batch, max_batches=exp_cfg.eval.batches),
            )
            for spec in exp_cfg.eval.data
        ]

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0 and bool(self.sets)

    def __call__(self, step: int, params: dict) -> dict:
        if not self.due(step):
            return {}
        metrics = {}
        for s in self.sets:
            r = heldout_loss(self.scorer, params, s.instances, self.batch)
            metrics[f"eval/{s.name}/CE loss"] = r["CE loss"]
            metrics[f"eval/{s.name}/PPL"] = r["PPL"]
        return metrics
