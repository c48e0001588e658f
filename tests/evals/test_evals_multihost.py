"""Held-out evaluation with two JAX processes (jax.distributed on 127.0.0.1, 2 CPU devices each), as
`olmax eval` and the trainer's in-loop evaluation run on a multi-host slice: every process gets the
same figures, equal to one process's on 8 devices. Parameters and batch are sharded over all 4
devices, so no process holds the whole model; the per-token results come back replicated."""

from __future__ import annotations

import json
import textwrap

import jax
import numpy as np
import pytest
from models import tiny_eval_model
from multihost import run_processes

from olmax.checkpoint.store import save_params
from olmax.config.data import DataConfig
from olmax.evals.heldout import eval_loss
from olmax.model.olmo3 import init_params

CFG = tiny_eval_model(vocab_size=5000, max_position=16)

WORKER = textwrap.dedent("""
    import json, sys
    import jax
    from olmax.checkpoint.store import load_params, read_config
    from olmax.config.data import DataConfig
    from olmax.evals.heldout import eval_loss, load_instances
    from olmax.evals.kl import token_kl
    from olmax.checkpoint.inference import eval_mesh
    from olmax.model.olmo3 import param_shardings

    port, pid, ckpt, shard, work, out = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    data_cfg = DataConfig(work_dir=work, vocab_size=5000, eos_token_id=4999, pad_token_id=0)
    loss = eval_loss(ckpt, [shard], seq_len=16, batch=4, max_batches=3, data_cfg=data_cfg)
    mesh = eval_mesh()
    params, cfg, _ = load_params(ckpt, shardings=param_shardings(read_config(ckpt)[0], mesh))
    instances = load_instances([shard], DataConfig(work_dir=work, seq_len=16, vocab_size=5000, eos_token_id=4999,
                                                   pad_token_id=0), batch=4, max_batches=3)
    kl = token_kl(params, cfg, params, cfg, instances, batch=4, mesh=mesh)
    json.dump({"devices": loss["devices"], "results": loss["results"], "kl_mean": kl["kl_mean"]},
              open(f"{out}.{pid}", "w"))
    jax.distributed.shutdown()
""")


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_two_processes_give_one_process_figures(tmp_path):
    save_params(tmp_path / "ckpt", jax.jit(init_params, static_argnums=0)(CFG, jax.random.key(0)), CFG, {})
    shard = tmp_path / "000000.npy"
    np.random.default_rng(0).integers(0, 4999, 12 * 16).astype(np.uint16).tofile(shard)
    out = tmp_path / "out.json"
    args = lambda pid: [str(tmp_path / "ckpt"), str(shard), str(tmp_path / f"cache{pid}"), str(out)]  # noqa: E731
    run_processes(WORKER, tmp_path, args)
    reports = [json.loads((tmp_path / f"out.json.{pid}").read_text()) for pid in range(2)]
    assert reports[0] == reports[1] and reports[0]["devices"] == 4
    data_cfg = DataConfig(work_dir=str(tmp_path / "cache"), vocab_size=5000, eos_token_id=4999, pad_token_id=0)
    alone = eval_loss(str(tmp_path / "ckpt"), [str(shard)], seq_len=16, batch=4, max_batches=3, data_cfg=data_cfg)
    assert alone["devices"] == 8
    for name, r in alone["results"].items():
        assert r["tokens"] == reports[0]["results"][name]["tokens"] == 12 * 15
        assert reports[0]["results"][name]["CE loss"] == pytest.approx(r["CE loss"], rel=1e-6)
    assert reports[0]["kl_mean"] == 0.0
