"""A checkpoint's parameters placed for inference: on a mesh of every device along `fsdp`
(parameters sharded, so a 32B fits; the batch split over all), as the evaluations, `olmax generate`
and the demos read them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from jax.sharding import Mesh

from olmax.checkpoint.store import complete_steps, load_params, read_config
from olmax.config.mesh import MeshConfig
from olmax.config.model import ModelConfig
from olmax.model.olmo3 import param_shardings
from olmax.model.sharding import make_mesh


def eval_mesh(devices=None) -> Mesh:
    """Every device on the fsdp axis: parameters sharded (a 32B fits), the batch split over all."""
    return make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1), devices)


def load_checkpoint(
    ckpt: str | Path, mesh: Mesh, *, step: Optional[int] = None, compute_dtype: Optional[str] = None
) -> tuple[dict, ModelConfig, dict]:
    """(params placed on `mesh`, model config, meta) of an olmax checkpoint (default: its latest step;
    meta gets the step it came from). `compute_dtype` overrides the dtype the stored config computes
    in (e.g. float32 for a noise-floor measurement)."""
    cfg, _ = read_config(ckpt, step)
    params, cfg, meta = load_params(ckpt, step, shardings=param_shardings(cfg, mesh))
    if compute_dtype is not None:
        cfg = replace(cfg, compute_dtype=compute_dtype)
    return params, cfg, {**meta, "step": step if step is not None else complete_steps(ckpt)[-1]}
