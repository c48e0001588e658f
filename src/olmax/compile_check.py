"""Lower and compile the real train step for a recipe on (fake) devices, with abstract arrays only,
and report per-device memory from XLA's memory analysis. Nothing of the model's size is allocated,
so the 7B's step can be checked on a laptop: `olmax compile-check --recipe olmo3_7b_stage1 --devices 128`
(the CLI sets up that many CPU devices; on an accelerator host it uses the real ones).
"""

from __future__ import annotations

import math
import time

import jax

from olmax.config import ExperimentConfig
from olmax.sharding import make_mesh
from olmax.state import abstract_state, state_shardings
from olmax.train_step import batch_layout, batch_sharding, make_train_step

GIB = 2**30


def _per_device_bytes(tree, shardings) -> int:
    """Bytes one device holds of a pytree of abstract arrays laid out by `shardings`."""
    return sum(math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
               for a, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))


def compile_report(cfg: ExperimentConfig, devices=None) -> dict:
    mesh = make_mesh(cfg.mesh, devices)
    layout = batch_layout(cfg, mesh)
    shardings = state_shardings(cfg, mesh)
    with jax.set_mesh(mesh):
        state = abstract_state(cfg, mesh)
        batch = {"input_ids": jax.ShapeDtypeStruct((cfg.trainer.global_batch, cfg.data.seq_len), "int32",
                                                   sharding=batch_sharding(cfg, mesh))}
        t0 = time.perf_counter()
        lowered = make_train_step(cfg, mesh).lower(state, batch)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
    mem = compiled.memory_analysis()
    return {
        "recipe": cfg.name,
        "devices": mesh.size,
        "mesh": dict(mesh.shape),
        "per_device_batch": layout.per_device,
        "micro_batch": layout.micro_batch,
        "accum_steps": layout.accum_steps,
        "lower_s": t1 - t0,
        "compile_s": t2 - t1,
        "params_gib": _per_device_bytes(state.params, shardings.params) / GIB,
        "opt_state_gib": _per_device_bytes(state.opt_state, shardings.opt_state) / GIB,
        # XLA's figures for one device's program (the backend compiled for; CPU here unless on accelerators)
        "arguments_gib": mem.argument_size_in_bytes / GIB,
        "outputs_gib": mem.output_size_in_bytes / GIB,
        "temporaries_gib": mem.temp_size_in_bytes / GIB,
        "backend": jax.default_backend(),
    }


def format_report(r: dict) -> str:
    return "\n".join([
        f"{r['recipe']} on {r['devices']} {r['backend']} devices, mesh {r['mesh']}",
        f"per-device batch {r['per_device_batch']} = {r['accum_steps']} micro-batches of {r['micro_batch']}",
        f"lowered in {r['lower_s']:.1f} s, compiled in {r['compile_s']:.1f} s",
        f"per device: parameters {r['params_gib']:.2f} GiB, optimizer state {r['opt_state_gib']:.2f} GiB, "
        f"temporaries {r['temporaries_gib']:.2f} GiB (XLA: arguments {r['arguments_gib']:.2f}, "
        f"outputs {r['outputs_gib']:.2f})",
    ])
