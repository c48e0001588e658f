"""model.remat=auto's search (olmax.fit.remat_search, olmax.fit.remat.choose_remat) with a scripted compiler:
which candidates it compiles and in what order, what it chooses, its record and cache, and the error
that names what would fit. The real compiler's part is tests/fit/test_compile_check.py's."""

import dataclasses
import json
import logging
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import random_params
from small_run import SMALL, small_config

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.config.remat import AUTO_LADDER
from olmax.fit import chips, remat, remat_search
from olmax.fit.compiler import GIB, CompileResult, CompilerRefused, DoesNotFit
from olmax.fit.remat import choose_remat
from olmax.fit.remat_search import RECORD_FILE
from olmax.model.olmo3 import forward
from olmax.model.sharding import make_mesh
from olmax.step.train_step import make_train_step

EVERY_MATMUL, SEEDS, NO_GATE, QKV_CTX_O, QKV, FULL = AUTO_LADDER
V5P = chips.CHIPS["v5p"]  # budget 95% of 95.74 = 90.95 GiB
REFUSED = None  # the compiler ran out of HBM


def scripted(monkeypatch, peaks):
    """compile_step replaced by a table: (remat, serial) -> peak GiB or REFUSED, or a function of the
    config. Returns the list of the (remat, serial) compiled, in order."""
    compiled = []

    def compile_step(cfg, mesh, options, where):
        key = (cfg.model.remat, cfg.model.remat_serial)
        compiled.append(key)
        peak = peaks(cfg) if callable(peaks) else peaks[key]
        if peak is REFUSED:
            raise CompilerRefused("scripted", "HBM", "out of HBM: scripted")
        memory = SimpleNamespace(peak_memory_in_bytes=int(peak * GIB))
        return CompileResult(SimpleNamespace(memory_analysis=lambda: memory), 0.0, 0.0, None)

    monkeypatch.setattr(remat, "compile_step", compile_step)
    monkeypatch.setattr(remat, "TOP_FIRST", 0.0)  # the bisection's order (a tiny model would start at the top)
    return compiled


def table(*rows):
    """{(set, serial): peak} from one (compiler's order, serial) pair per set of the ladder."""
    return {(s, serial): row[serial] for s, row in zip(AUTO_LADDER, rows) for serial in (False, True)}


def replace_remat(cfg, remat):
    return dataclasses.replace(cfg.model, remat=remat)


def auto_cfg(*overrides):
    return apply_overrides(get_recipe("tiny"), [*SMALL, "model.remat=auto", *overrides])


def choose(cfg, cache_dir=None, chip=V5P, **mesh):
    mesh = make_mesh(dataclasses.replace(cfg.mesh, **mesh))
    return choose_remat(cfg, mesh, chip, "8 cpu devices", {}, cache_dir)


# Heaps in the shape of the 7B's sweep rows (docs/performance/remat.md): the refusals and the seeds' set as
# measured on each slice; the two sets the sweep did not compile, between their neighbours
V5P_4X4X4 = table((REFUSED, REFUSED), (REFUSED, 88.97), (85.0, 78.0), (70.0, 62.0), (58.60, 43.76), (18.01, 19.96))
IRONWOOD_4X4X4 = table((REFUSED, REFUSED), (86.10, 91.02), (80.0, 76.0), (66.0, 60.0), (58.12, 43.31), (34.39, 19.46))
V5P_8X8X8 = table((30.66, 27.58), (25.80, 22.17), (24.0, 21.0), (22.0, 18.0), (14.53, 10.68), (4.58, 4.81))


@pytest.mark.parametrize(
    "peaks, chosen, compiled",
    [
        # the seeds' set fits only in the serial order: 5 compiles, 2 of them accepted by the compiler
        (
            V5P_4X4X4,
            (SEEDS, True),
            [(QKV_CTX_O, False), (SEEDS, False), (SEEDS, True), (EVERY_MATMUL, False), (EVERY_MATMUL, True)],
        ),
        # ... only in the compiler's order (its serial order is over the budget, never compiled)
        (
            IRONWOOD_4X4X4,
            (SEEDS, False),
            [(QKV_CTX_O, False), (SEEDS, False), (EVERY_MATMUL, False), (EVERY_MATMUL, True)],
        ),
        # everything fits: three compiles, the most kept set in the compiler's order
        (V5P_8X8X8, (EVERY_MATMUL, False), [(QKV_CTX_O, False), (SEEDS, False), (EVERY_MATMUL, False)]),
    ],
    ids=["v5p-4x4x4", "ironwood-4x4x4", "v5p-8x8x8"],
)
def test_bisection_takes_the_first_candidate_that_fits(monkeypatch, peaks, chosen, compiled):
    done = scripted(monkeypatch, peaks)
    choice = choose(auto_cfg())
    assert (choice.cfg.model.remat, choice.cfg.model.remat_serial) == chosen
    assert done == compiled
    assert [(c["remat"], c["serial"]) for c in choice.record["candidates"]] == compiled
    assert choice.compiled is not None  # the chosen step, compiled: compile-check reports it as is


def test_the_record_is_reused_for_the_same_step_and_devices_only(monkeypatch, tmp_path):
    done = scripted(monkeypatch, V5P_4X4X4)
    first = choose(auto_cfg(), tmp_path)
    stored = json.loads((tmp_path / RECORD_FILE).read_text())
    (record,) = stored.values()
    assert record["remat"] == SEEDS and record["remat_serial"] and record["budget_gib"] == pytest.approx(90.953)
    assert record["key"]["devices"] == "8 x cpu" and record["key"]["mesh"]["fsdp"] == 8
    assert {"olmax", "jax", "jaxlib"} <= set(record["key"]["versions"])

    searched = len(done)
    again = choose(auto_cfg(), tmp_path)  # a restart: nothing compiled
    assert len(done) == searched and again.cfg == first.cfg
    assert again.source == str(tmp_path / RECORD_FILE) and again.compiled is None
    # other devices (here another mesh of them), or another step, search again and add their record
    choose(auto_cfg(), tmp_path, data=2, fsdp=4)
    choose(auto_cfg("trainer.micro_batch_size=2"), tmp_path)
    assert len(done) == 3 * searched and len(json.loads((tmp_path / RECORD_FILE).read_text())) == 3


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_auto_changes_memory_never_numerics(monkeypatch):
    """What auto chooses differs from the given config in model.remat and model.remat_serial alone,
    and the model it gives computes the loss and gradients the model without remat does."""
    scripted(monkeypatch, V5P_4X4X4)
    cfg = auto_cfg("model.vocab_size=512")
    chosen = choose(cfg).cfg
    assert (chosen.model.remat, chosen.model.remat_serial) == (SEEDS, True)
    assert dataclasses.replace(chosen, model=dataclasses.replace(chosen.model, remat="auto", remat_serial=False)) == cfg

    params = random_params(cfg.model, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, cfg.data.seq_len), 0, cfg.model.vocab_size)
    loss = lambda p, model: jnp.mean(jax.nn.logsumexp(forward(p, tokens, model), axis=-1))  # noqa: E731
    value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    (got, grads), (want, base) = (value_and_grad(params, m) for m in (chosen.model, replace_remat(cfg, "none")))
    assert got == pytest.approx(float(want), rel=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(base)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_an_unchosen_auto_builds_no_step():
    with pytest.raises(Exception, match="model.remat=auto has not been chosen"):
        make_train_step(auto_cfg(), make_mesh(auto_cfg().mesh))


def test_devices_without_a_budget_take_the_most_kept_set_uncompiled(monkeypatch):
    done = scripted(monkeypatch, V5P_4X4X4)
    choice = choose(auto_cfg(), chip=None)
    assert (choice.cfg.model.remat, choice.cfg.model.remat_serial, choice.record, done) == (
        EVERY_MATMUL,
        False,
        None,
        [],
    )


def test_a_step_that_fits_nowhere_names_what_would(monkeypatch):
    """8 instances per device as 2 micro-batches of 4: every candidate is over the budget, and
    recomputing whole blocks peaks at 95 GiB, 1 GiB of it the state. Micro-batches of 2 fit: the
    first suggestion, checked by compiling it."""

    def peak(cfg):
        return (95.0 if cfg.model.remat_serial else 96.0) if cfg.trainer.micro_batch_size == 4 else 50.0

    done = scripted(monkeypatch, peak)
    cfg = auto_cfg("trainer.global_batch=64", "trainer.micro_batch_size=4")
    with pytest.raises(DoesNotFit) as e:
        choose(cfg)
    message = str(e.value)
    assert message.startswith(
        "tiny does not fit on 8 cpu devices under any remat policy, down to recomputing whole blocks (full): "
        "peak 95.00 GiB (serial) > the budget of 90.95 GiB per device; parameters and optimizer state take"
    )
    assert (
        "- trainer.micro_batch_size=2: 4 micro-batches of 2 per device instead of 2 of 4, accumulated (the "
        "global batch stays 64): 128 tokens per device at a time; about 47.5 GiB; checked with model.remat=full "
        "(serial): peak 50.00 GiB, fits" in message
    )
    assert "- mesh.context=2: each sequence over 2 devices, 128 tokens per device at a time" in message
    assert "- mesh.tensor=2: heads and MLP over 2 devices (1 heads each)" in message
    assert "- 16 devices instead of 8: 4 instances per device" in message
    # bisection down the ladder (both orders of each set it probes), then the suggestion's one compile
    assert done == [(QKV_CTX_O, False), (QKV_CTX_O, True), (FULL, False), (FULL, True), (FULL, True)]


def test_with_every_axis_fixed_the_mesh_suggestions_take_devices_from_fsdp(monkeypatch):
    """mesh.data=2 mesh.fsdp=4 has no -1 axis to give up devices for a tensor axis of 2: the suggestion
    halves fsdp with it (as the 32B Think RL step on 96 GPUs needs: docs/post-training/rl-recipes.md)."""
    scripted(monkeypatch, lambda cfg: 95.0)
    cfg = auto_cfg("trainer.global_batch=64", "mesh.data=2", "mesh.fsdp=4")
    with pytest.raises(DoesNotFit) as e:
        choose(cfg)
    message = str(e.value)
    assert "- mesh.tensor=2 mesh.fsdp=2: heads and MLP over 2 devices (1 heads each)" in message


@pytest.fixture
def record_folder(tmp_path, request):
    """The compilation cache's folder as jax's config names it (where a run's search shares its record),
    the test's own: a record of another test or session with the same key would be read instead."""
    folder = tmp_path / "compile-cache"
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(folder))
    request.addfinalizer(lambda: jax.config.update("jax_compilation_cache_dir", before))
    return folder


def test_train_chooses_before_its_first_step_and_a_restart_reads_the_choice(
    monkeypatch, tmp_path, capsys, record_folder
):
    """olmax train with model.remat=auto (the CPU devices given a v5p's budget): the search runs before
    the first step, its record goes to the run directory and its lines to the log; config.yaml keeps
    auto and the checkpoint the choice; the restart compiles no candidate."""
    from olmax.checkpoint.store import read_config
    from olmax.trainer import run as train_module

    monkeypatch.setattr(remat, "chip_of_device", lambda device: V5P)
    done = scripted(monkeypatch, V5P_4X4X4)
    cfg = small_config(tmp_path, "model.remat=auto", "model.vocab_size=512", "trainer.max_steps=2")
    run_dir = tmp_path / "run"
    train_module.train(cfg, run_dir, stop_at=1, progress=False)
    assert len(done) == 5 and (run_dir / RECORD_FILE).exists()
    log = capsys.readouterr().out
    assert f"model.remat=auto on 8 x cpu (budget 90.95 GiB per device): {SEEDS}, serial; 5 compiles" in log
    assert "remat: auto" in (run_dir / "config.yaml").read_text()
    model, _ = read_config(run_dir / "checkpoints")
    assert (model.remat, model.remat_serial) == (SEEDS, True)

    train_module.train(cfg, run_dir, progress=False)
    assert len(done) == 5
    assert f"{SEEDS}, serial, as searched on" in capsys.readouterr().out


def test_the_trainer_runs_the_program_the_search_compiled(monkeypatch, tmp_path, record_folder):
    """olmax train with model.remat=auto on devices with a budget: the search compiles the chosen step
    and the trainer runs the program it compiled for the chosen set for every step, so that step is not
    compiled again for the first step; the search's record goes to the run directory
    and to the compilation cache's folder, from which a run in a new run directory reads it, searching
    nothing. Without the reuse (the trainer's own jit) the step is compiled a second time."""
    from olmax.fit import compile_cache
    from olmax.trainer import loop
    from olmax.trainer.run import train

    shared = record_folder
    assert compile_cache.active_dir() == str(shared)
    monkeypatch.setattr(remat, "chip_of_device", lambda device: V5P)
    compiles = []
    real = remat.compile_step
    monkeypatch.setattr(remat, "compile_step", lambda *a: compiles.append("search") or real(*a))
    cfg = small_config(tmp_path, "model.remat=auto", "model.vocab_size=512", "trainer.max_steps=2")

    def steps_compiled(run_dir) -> int:
        """The train step's XLA compiles during a run (jax logs each when jax_log_compiles is on), a program
        read back from the session's compilation cache included: jax 0.10.2 logs the compile around
        compile_or_get_cached (jax/_src/interpreters/pxla.py, _cached_compilation), and the last run below
        counts the trainer's own compile of a step the search compiled, which the cache holds."""
        seen = []
        handler = logging.Handler()
        handler.emit = lambda record: seen.append(record.getMessage())
        logger = logging.getLogger("jax")
        logger.addHandler(handler)
        try:
            with jax.log_compiles(True):
                train(cfg, run_dir, progress=False)
        finally:
            logger.removeHandler(handler)
        return sum("Finished XLA compilation of jit(step_fn)" in m for m in seen)

    assert steps_compiled(tmp_path / "run") == len(compiles) > 0  # the search's compiles only
    assert (tmp_path / "run" / RECORD_FILE).exists() and (shared / RECORD_FILE).exists()
    compiles.clear()
    assert steps_compiled(tmp_path / "new") == 1 and compiles == []  # the record read, the step compiled once
    monkeypatch.setattr(loop, "_compiled_for", lambda compiled, args: False)
    (shared / RECORD_FILE).unlink()
    assert steps_compiled(tmp_path / "again") == len(compiles) + 1  # the search's, then the trainer's own


def test_a_step_that_clearly_fits_compiles_the_most_kept_set_first(monkeypatch):
    """The tally (state, float32 gradients, the most kept set's activations) of the tiny model is far
    under a v5p's budget: the top set is compiled first and, fitting, is the choice after one compile;
    where it does not fit after all, the bisection goes on below it."""
    cfg = apply_overrides(get_recipe("tiny"), [*SMALL, "model.remat=auto"])
    done = scripted(monkeypatch, lambda c: 1.0)
    monkeypatch.setattr(remat, "TOP_FIRST", remat_search.TOP_FIRST)
    assert choose(cfg).cfg.model.remat == EVERY_MATMUL and done == [(EVERY_MATMUL, False)]
    done = scripted(monkeypatch, lambda c: REFUSED if c.model.remat == EVERY_MATMUL else 1.0)
    monkeypatch.setattr(remat, "TOP_FIRST", remat_search.TOP_FIRST)
    assert choose(cfg).cfg.model.remat == SEEDS
    assert done == [(EVERY_MATMUL, False), (EVERY_MATMUL, True), (QKV_CTX_O, False), (NO_GATE, False), (SEEDS, False)]
    mesh = make_mesh(cfg.mesh, jax.devices())
    assert remat_search.tallied_bytes(cfg, mesh) < remat_search.TOP_FIRST * V5P.hbm_limit_gib * GIB
