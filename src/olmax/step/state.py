"""The training state and where it lives: `TrainState`, its shardings, its abstract shape.

Everything that creates, restores, checks or compiles a train state asks here: the step
(olmax.step.train_step), the checkpointer (olmax.checkpoint.store takes the abstract state below as its restore
target), checkpoint surgery, compile-check and scoring. Layouts come from the model's `param_specs`
through the ONE rules table in olmax.model.sharding: both optimizer moments follow their parameter; the
step and the skip-step window are replicated.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from olmax.config.experiment import ExperimentConfig
from olmax.config.model import ModelConfig
from olmax.errors import ConfigError
from olmax.model.olmo3 import init_params, param_shardings, param_specs
from olmax.step.optim import AdamWState, Optimizer, OptState, SkipWindow


class TrainState(NamedTuple):
    step: jax.Array  # int32 scalar: optimizer steps completed (checkpoint N holds the state after step N)
    params: dict
    opt_state: OptState


def _check_fsdp_divides(model: ModelConfig, mesh: Mesh) -> None:
    """FSDP shards every matrix over its d_model dimension (the rules table's `embed`); a dimension an
    axis does not divide stays whole (olmax.model.sharding.logical_to_spec), which for d_model would leave the
    training state unsharded over fsdp: refused, naming an HSDP layout that divides it (DeepSpeed
    ZeRO-3, which AI2 ran on 96 GPUs for the 32B RL, pads flattened parameters instead). Only the
    training state: the evaluation and surgery commands, which take no mesh settings, lay parameters
    alone over all devices and keep what does not divide whole, as before."""
    fsdp, d = mesh.shape["fsdp"], model.d_model
    if fsdp == 1 or d % fsdp == 0:
        return
    replicas = mesh.shape["data"] * fsdp
    group = max(f for f in range(1, replicas + 1) if replicas % f == 0 and d % f == 0)
    where = "every device" if mesh.shape["tensor"] == 1 else "every device of a tensor group"
    layout = (
        f"mesh.data={replicas} mesh.fsdp=1 (data parallelism)"
        if group == 1
        else f"mesh.data={replicas // group} mesh.fsdp={group} (HSDP: sharded within groups of {group} devices, "
        f"replicated across {replicas // group} groups)"
    )
    raise ConfigError(
        f"mesh.fsdp={fsdp} does not divide model.d_model={d}, the dimension FSDP shards the parameters over: "
        f"{where} would hold all of the parameters and optimizer state. Set an fsdp size that divides it, "
        f"e.g. {layout}"
    )


def state_shardings(cfg: ExperimentConfig, mesh: Mesh) -> TrainState:
    """NamedShardings of the TrainState on `mesh`."""
    _check_fsdp_divides(cfg.model, mesh)
    params = param_shardings(cfg.model, mesh)
    rep = NamedSharding(mesh, PartitionSpec())
    opt = OptState(AdamWState(rep, params, params), SkipWindow(rep, rep, rep))
    return TrainState(rep, params, opt)


def optimizer(cfg: ExperimentConfig) -> Optimizer:
    return Optimizer(cfg.optimizer, param_specs(cfg.model))


def _step_zero(cfg: ExperimentConfig, key: jax.Array, params: Optional[dict]) -> TrainState:
    if params is None:
        params = init_params(cfg.model, key)
    params = jax.tree.map(lambda p: p.astype(jnp.dtype(cfg.model.param_dtype)), params)
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer(cfg).init(params))


def init_program(cfg: ExperimentConfig, mesh: Mesh):
    """The jitted init of a fresh TrainState on `mesh`, `(key, params or None) -> TrainState`, created
    sharded and compiled with the init's own compiler options (olmax.step.state.init_compiler_options)."""
    platform = mesh.devices.flat[0].platform
    return jax.jit(
        lambda key, params: _step_zero(cfg, key, params),
        out_shardings=state_shardings(cfg, mesh),
        compiler_options=init_compiler_options(platform),
    )


def init_train_state(cfg: ExperimentConfig, mesh: Mesh, key: jax.Array, params: Optional[dict] = None) -> TrainState:
    """A fresh TrainState at step 0, created sharded. Given `params` (e.g. converted weights), they
    are placed on the mesh and get a fresh optimizer; otherwise init_params(cfg.model, key)."""
    program = init_program(cfg, mesh)  # first: its shardings refuse an fsdp size that leaves params whole
    if params is not None:
        params = jax.device_put(params, param_shardings(cfg.model, mesh))
    return program(key, params)


def abstract_state(cfg: ExperimentConfig, mesh: Mesh) -> TrainState:
    """The TrainState as ShapeDtypeStructs carrying their shardings on `mesh`: nothing is allocated.
    It is the restore target of a checkpoint (Orbax reads each device's shard into that layout) and
    the argument that compile-check lowers the step with."""
    # the key is made inside eval_shape: on an AOT topology no concrete array may be placed anywhere
    shapes = jax.eval_shape(lambda: _step_zero(cfg, jax.random.key(0), None))
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, state_shardings(cfg, mesh)
    )


def per_device_bytes(tree) -> int:
    """Bytes one device holds of a pytree of abstract arrays carrying their shardings (as
    `abstract_state` gives them)."""
    return sum(math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(tree))


# Programs that draw the initial parameters compile under libtpu's default scoped VMEM (16 MiB), not
# the profile's 64 MiB, which the commands set for the whole process: with 32 or 64 MiB libtpu 0.0.42.1
# retries the tiling of the fused truncated-normal draw of one large matrix 8 times (its fusion's
# "retry_count" in the compiled program: the 190m's (12, 3072, 768) MLP stack, the 7B's (100352, 4096)
# embedding), and a v5e's training-row init compiled in 52-59 s; at 16 MiB it retries once and took
# 13-17 s (docs/performance/tpu-v5e.md); the draw runs in under 0.1 s either way.
INIT_COMPILER_OPTIONS = {"tpu": {"xla_tpu_scoped_vmem_limit_kib": "16384"}}


def init_compiler_options(platform: str) -> Optional[dict[str, object]]:
    """Compiler options for a program that initialises parameters on devices of `platform`, or None."""
    return INIT_COMPILER_OPTIONS.get(platform)
