"""OLMo-core distributed checkpoints into olmax: a checkpoint ai2-olmo-core 3.0.0 itself writes (its
Checkpointer, from its TransformerTrainModule and SkipStepAdamW after a few training steps) is read
by `olmax convert --from-olmo-core` (parameters bit for bit) and by `olmax ckpt warm-start
--from-olmo-core` (parameters, AdamW moments, step counter, trainer step), and olmax's next training
step from that warm start matches OLMo-core's next step on the same batch.

Tolerances of the next step (measured, float32 on 8 devices: CE equal; parameters 9.6e-8 of the
overall norm; per tensor 3.4e-5 of its largest entry for the embedding, whose rarely seen rows get
near-zero gradients that Adam still turns into steps, and <= 1.9e-7 for the others): CE within 1e-5,
parameters within 1e-5 of the overall norm and every tensor within 1e-4 of its largest entry.
Dropping the moments or the step counter, or a wrong learning-rate step, moves parameters by ~lr
(3e-3), 10% of their 0.02 scale.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from olmax.parity.harness import PAD, Setup
from olmax.parity.olmo_core import build_olmo_core_model
from olmax.parity.training import olmax_experiment, olmax_model_config

pytest.importorskip("olmo_core")

SETUP = Setup(steps=20, n_layers=2, skip_window=16)
TRAINED_STEPS = 3  # steps OLMo-core trains before it checkpoints


def batch(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, PAD, size=(SETUP.global_batch, SETUP.seq_len)).astype(np.int32)


def olmo_core_step(train_module, input_ids: np.ndarray, step: int) -> float:
    """One training step as OLMo-core's train module takes it (see olmax.parity.training)."""
    import torch
    from olmo_core.data.utils import get_labels
    from olmo_core.optim import CosWithWarmup

    model, opt = train_module.model, train_module.optim
    ids = torch.from_numpy(input_ids).long()
    labels = get_labels({"input_ids": ids})
    opt.zero_grad(set_to_none=True)
    out = model(
        ids,
        labels=labels,
        loss_reduction="sum",
        z_loss_multiplier=1e-5,
        loss_div_factor=(labels != -100).sum(),
        return_logits=False,
    )
    out.loss.backward()
    params = list(model.parameters())
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm)
    lr = CosWithWarmup(warmup=SETUP.warmup, alpha_f=SETUP.alpha_f).get_lr(SETUP.lr, step, SETUP.steps)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.latest_loss = out.ce_loss.detach()
    opt.latest_grad_norm = norm
    opt.step()
    assert not float(opt.step_skipped)
    return float(out.ce_loss)


@pytest.fixture(scope="module")
def olmo_core_run(tmp_path_factory):
    """OLMo-core trains TRAINED_STEPS steps and checkpoints with its own Checkpointer (step directory
    with model_and_optim/ and train/rank0.pt); yields (train module, its stepN dir, olmax config)."""
    import torch
    from olmo_core.optim import OptimGroupOverride, SkipStepAdamWConfig
    from olmo_core.train.checkpoint import Checkpointer
    from olmo_core.train.train_module import TransformerTrainModule
    from olmo_core.train.utils import EnvRngStates

    from olmax.config.io import save_yaml

    work = tmp_path_factory.mktemp("olmo_core")
    torch.manual_seed(0)
    model = build_olmo_core_model(SETUP)
    optim = SkipStepAdamWConfig(
        lr=SETUP.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=0.1,
        rolling_interval_length=SETUP.skip_window,
        group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts={"weight_decay": 0.0})],
    )
    train_module = TransformerTrainModule(
        model,
        optim,
        rank_microbatch_size=SETUP.global_batch * SETUP.seq_len,
        max_sequence_length=SETUP.seq_len,
        device=torch.device("cpu"),
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in range(1, TRAINED_STEPS + 1):
            olmo_core_step(train_module, batch(step), step)
        step_dir = work / f"step{TRAINED_STEPS}"
        # the fields of OLMo-core's Trainer.state_dict() that a loop without a Trainer can fill
        Checkpointer(work_dir=work / "tmp").save(
            step_dir,
            train_module,
            {
                "global_step": TRAINED_STEPS,
                "global_train_tokens_seen": TRAINED_STEPS * SETUP.global_batch * SETUP.seq_len,
                "max_steps": SETUP.steps,
                "epoch": 1,
                "world_size": 1,
                "rng": EnvRngStates.current_state().as_dict(),
            },
        )
        cfg = olmax_experiment(olmax_model_config(model, SETUP), [], SETUP, work / "olmax")
        save_yaml(cfg, work / "experiment.yaml")
        yield train_module, step_dir, cfg
    finally:
        torch.set_num_threads(threads)


def cli(*args: str):
    from olmax.cli.common import app

    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parity
def test_convert_reads_the_model_bit_for_bit(olmo_core_run, tmp_path):
    from olmax.checkpoint.store import load_params
    from olmax.convert.olmo_core import OLMO_CORE_NAMES
    from olmax.convert.tensors import torch_tensors

    train_module, step_dir, cfg = olmo_core_run
    result = cli(
        "convert",
        "--from-olmo-core",
        step_dir,
        "--out",
        tmp_path / "ckpt",
        "--config",
        step_dir.parent / "experiment.yaml",
    )
    assert result.exit_code == 0, result.output
    params, model_cfg, _ = load_params(tmp_path / "ckpt")
    assert model_cfg == cfg.model
    state = {k: v.detach().numpy() for k, v in train_module.model.state_dict().items()}
    converted = dict(torch_tensors(params, model_cfg, OLMO_CORE_NAMES, "float32"))
    assert set(converted) == set(state)
    for name, tensor in converted.items():
        # the vocabulary rows only (torch_tensors drops the padding; checked below)
        assert np.array_equal(tensor, state[name][: tensor.shape[0]]), name
    # the padded vocabulary rows come along too
    assert np.array_equal(np.asarray(params["embed"]), state["embeddings.weight"])
    assert np.array_equal(np.asarray(params["lm_head"]), state["lm_head.w_out.weight"].T)


@pytest.mark.parity
def test_next_step_after_warm_start_matches_olmo_core(olmo_core_run, tmp_path):
    import jax

    from olmax.checkpoint.surgery import load_warm_start
    from olmax.model.sharding import make_mesh
    from olmax.step.train_step import batch_sharding, make_train_step

    train_module, step_dir, cfg = olmo_core_run
    result = cli(
        "ckpt",
        "warm-start",
        "--from-olmo-core",
        step_dir,
        tmp_path / "ws",
        "--config",
        step_dir.parent / "experiment.yaml",
        "--json",
        tmp_path / "ws.json",
    )
    assert result.exit_code == 0, result.output
    assert f"step {TRAINED_STEPS}, kept moments,params, Adam counter {TRAINED_STEPS}" in result.output

    mesh = make_mesh(cfg.mesh)
    with jax.set_mesh(mesh):
        state, data_state = load_warm_start(tmp_path / "ws", cfg, mesh)
        assert int(state.step) == TRAINED_STEPS and data_state is None
        assert int(state.opt_state.adam.count) == TRAINED_STEPS and int(state.opt_state.window.seen) == 0
        nxt = batch(TRAINED_STEPS + 1)
        batch_in = {"input_ids": jax.device_put(nxt, batch_sharding(cfg, mesh))}
        state, metrics = make_train_step(cfg, mesh)(state, batch_in)
        ours = jax.tree.map(np.asarray, jax.device_get(state.params))
        metrics = jax.device_get(metrics)

    import torch

    from olmax.convert.olmo_core import OLMO_CORE_NAMES
    from olmax.convert.tensors import torch_tensors

    torch.set_num_threads(1)
    ref_ce = olmo_core_step(train_module, nxt, TRAINED_STEPS + 1)
    assert abs(float(metrics["ce_loss"]) - ref_ce) < 1e-5, (float(metrics["ce_loss"]), ref_ce)
    assert int(state.opt_state.adam.count) == TRAINED_STEPS + 1
    ref = {k: v.detach().numpy() for k, v in train_module.model.state_dict().items()}
    mine = dict(torch_tensors(ours, cfg.model, OLMO_CORE_NAMES, "float32"))
    diff2 = total2 = 0.0
    for name, a in mine.items():
        b = ref[name][: a.shape[0]]
        assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max(), name
        diff2 += float(np.sum((a - b) ** 2))
        total2 += float(np.sum(b**2))
    assert (diff2 / total2) ** 0.5 < 1e-5


@pytest.mark.parity
def test_bad_olmo_core_checkpoints_are_named(olmo_core_run, tmp_path):
    train_module, step_dir, cfg = olmo_core_run
    config = step_dir.parent / "experiment.yaml"
    missing = tmp_path / "nope"
    result = cli("ckpt", "warm-start", "--from-olmo-core", missing, tmp_path / "ws", "--config", config)
    assert result.exit_code == 2 and f"{missing} does not exist" in result.output

    # a model that is not the checkpoint's
    result = cli(
        "ckpt", "warm-start", "--from-olmo-core", step_dir, tmp_path / "ws", "--config", config, "model.n_layers=3"
    )
    assert result.exit_code == 2 and "does not match the model config (3 layers)" in result.output
    result = cli(
        "convert", "--from-olmo-core", step_dir, "--out", tmp_path / "c", "--config", config, "model.mlp_hidden=128"
    )
    assert result.exit_code == 2 and "blocks.0.feed_forward.w1.weight has shape" in result.output

    # corrupt: the DCP metadata, then a truncated data file
    broken = tmp_path / "broken"
    shutil.copytree(step_dir, broken)
    (broken / "model_and_optim" / ".metadata").write_bytes(b"not a checkpoint")
    result = cli("convert", "--from-olmo-core", broken, "--out", tmp_path / "c", "--config", config)
    assert result.exit_code == 2 and "is not a readable OLMo-core distributed checkpoint" in result.output
    shutil.rmtree(broken)
    shutil.copytree(step_dir, broken)
    for f in (broken / "model_and_optim").glob("*.distcp"):
        f.write_bytes(f.read_bytes()[:100])
    result = cli("ckpt", "warm-start", "--from-olmo-core", broken, tmp_path / "ws", "--config", config)
    assert result.exit_code == 2 and "cannot read model." in result.output and str(broken) in result.output

    # no trainer state: the step must be reset (or the stepN directory given)
    result = cli(
        "ckpt", "warm-start", "--from-olmo-core", step_dir / "model_and_optim", tmp_path / "ws", "--config", config
    )
    assert result.exit_code == 2 and "holds no OLMo-core trainer state" in result.output
    result = cli(
        "ckpt",
        "warm-start",
        "--from-olmo-core",
        step_dir / "model_and_optim",
        tmp_path / "ws",
        "--config",
        config,
        "--reset-step",
    )
    assert result.exit_code == 0, result.output
    assert "step 0, kept moments,params, Adam counter 3" in result.output
    # a model saved without its optimizer: the moments cannot be kept, the parameters can
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    save_model_and_optim_state(tmp_path / "model_only", train_module.model)
    result = cli(
        "ckpt",
        "warm-start",
        "--from-olmo-core",
        tmp_path / "model_only",
        tmp_path / "ws2",
        "--config",
        config,
        "--reset-step",
    )
    assert result.exit_code == 2 and "holds no AdamW state to keep" in result.output
    result = cli(
        "ckpt",
        "warm-start",
        "--from-olmo-core",
        tmp_path / "model_only",
        tmp_path / "ws2",
        "--config",
        config,
        "--reset-step",
        "--keep",
        "params",
    )
    assert result.exit_code == 0 and "kept params, Adam counter 0" in result.output, result.output
    # never over an existing checkpoint
    result = cli("ckpt", "warm-start", "--from-olmo-core", step_dir, tmp_path / "ws", "--config", config)
    assert result.exit_code == 2 and "is not empty" in result.output
