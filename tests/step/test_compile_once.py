"""The train step compiles once: steps after the first trigger no XLA compilation at all (neither the
step nor any stray jitted helper), across 8 devices with FSDP, the chunked output layer and remat."""

import jax
import jax.monitoring
import numpy as np
from small_run import SMALL

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.model.sharding import make_mesh
from olmax.step.state import init_train_state
from olmax.step.train_step import batch_sharding, make_train_step

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # recorded once per XLA compilation


def test_train_step_compiles_once():
    # the small run's model with a small vocabulary: compiling the step is what this test pays for
    overrides = ["model.vocab_size=512", "trainer.loss_chunk=16", "model.remat=full", "mesh.fsdp=8"]
    cfg = apply_overrides(get_recipe("tiny"), SMALL + overrides)
    compiles = []

    def listener(event, duration, **_):
        if event == COMPILE_EVENT:
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        mesh = make_mesh(cfg.mesh)
        rng = np.random.default_rng(0)
        with jax.set_mesh(mesh):
            state = init_train_state(cfg, mesh, jax.random.key(0))
            step = make_train_step(cfg, mesh)
            per_step = []
            for _ in range(4):
                ids = rng.integers(
                    0, cfg.model.vocab_size, (cfg.trainer.global_batch, cfg.data.seq_len), dtype=np.int32
                )
                before = len(compiles)
                state, metrics = step(state, {"input_ids": jax.device_put(ids, batch_sharding(cfg, mesh))})
                float(metrics["loss"])
                per_step.append(len(compiles) - before)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert per_step[0] >= 1, "the listener saw no compilation at all: the event name changed"
    assert per_step[1:] == [0, 0, 0], per_step
    assert step._cache_size() == 1
