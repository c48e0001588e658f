"""What model.remat=auto's record is keyed by (olmax.fit.remat_search.search_key), both ways: every config
field that changes the compiled step's shapes, operations or memory, the objective's section, the
compiler's flags and olmax's code change the key; the run's length, learning rate, seeds, logging,
checkpoints and data source do not. And what that means for a run: an LM record is not read for a DPO
step of the same shapes, and a shared folder that cannot hold the record is a warning, not an error."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from small_run import SMALL
from test_remat_search import V5P, V5P_4X4X4, scripted

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.fit import remat, remat_search
from olmax.fit.remat import choose_for_devices, choose_remat
from olmax.fit.remat_search import RECORD_FILE, UNKEYED, search_key, step_fingerprint
from olmax.model.sharding import make_mesh


def config(*overrides):
    return apply_overrides(get_recipe("tiny"), [*SMALL, "model.remat=auto", "optimizer.z_loss=0", *overrides])


def leaves(obj, prefix: str):
    """(dotted path, value) of every field of a config section, nested ones (model.splash_blocks.q) too."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def other(value):
    """A value unlike `value`, of its kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, tuple):
        return (*value, "x")
    return 7  # None


def unchecked_copy(obj):
    """A shallow copy of a config dataclass made without its __init__: ExperimentConfig copies (as it
    pickles) through its constructor, and so through its checks and its look-up of plug-in objectives."""
    new = object.__new__(type(obj))
    new.__dict__.update(vars(obj))
    return new


def with_field(cfg, path: str, value):
    """cfg with one field changed, without the config's own checks (the key reads values, whatever
    they are, and a changed value need not be a valid one)."""
    *parents, name = path.split(".")
    chain = [cfg]
    for parent in parents:
        chain.append(getattr(chain[-1], parent))
    new = unchecked_copy(chain[-1])
    object.__setattr__(new, name, value)
    for outer, parent in zip(reversed(chain[:-1]), reversed(parents)):
        outer = unchecked_copy(outer)
        object.__setattr__(outer, parent, new)
        new = outer
    return new


def test_the_brief_s_fields_are_classified_as_named():
    """The key's unkeyed list holds what a run may change without another search, and none of what
    changes the step."""
    assert {"trainer.max_steps", "optimizer.lr", "trainer.seed", "data.seed", "trainer.log_every"} <= UNKEYED
    keyed = {"trainer.objective", "trainer.global_batch", "trainer.micro_batch_size", "trainer.loss_normalisation"}
    keyed |= {"data.seq_len", "data.label_masks", "data.doc_masking", "mesh.fsdp", "model.n_layers"}
    assert not keyed & UNKEYED


@pytest.mark.parametrize("objective", ["lm", "dpo", "grpo"])
def test_every_field_that_changes_the_step_changes_the_key_and_no_other(objective):
    """Each field of the config changed alone: the key changes exactly for the fields of the step's
    sections but the unkeyed ones, and for the objective's own section; every other section (the
    schedule, checkpoints, evaluation, logging, the other objectives' sections) leaves it."""
    extra = {"lm": [], "dpo": ["trainer.objective=dpo"], "grpo": ["trainer.objective=grpo"]}[objective]
    extra += ["grpo.max_prompt_len=16", "grpo.max_response_len=32"]
    cfg = config(*extra)
    unchanged = step_fingerprint(cfg)
    changed, kept = set(), set()
    for path, value in leaves(cfg, ""):
        (changed if step_fingerprint(with_field(cfg, path, other(value))) != unchanged else kept).add(path)
    sections = {*remat_search.STEP_SECTIONS, *([objective] if objective != "lm" else [])}
    should_change = {p for p, _ in leaves(cfg, "") if p.split(".")[0] in sections and p not in UNKEYED}
    assert changed == should_change
    assert {"schedule.warmup_steps", "checkpoint.every", "wandb.project", "name"} <= kept
    assert ("dpo.beta" in changed) == (objective == "dpo") and ("grpo.beta" in changed) == (objective == "grpo")


def test_the_key_holds_the_objective_the_flags_and_the_code(monkeypatch, tmp_path):
    mesh = make_mesh(config().mesh)
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_a=1 --xla_b=2")
    key = search_key(config(), mesh)
    assert search_key(config("trainer.objective=dpo"), mesh) != key  # same shapes, twice the rows
    monkeypatch.setenv("XLA_FLAGS", "--xla_b=2 --xla_a=1")  # the same flags
    assert search_key(config(), mesh) == key
    monkeypatch.setenv("XLA_FLAGS", "--xla_b=2")
    assert search_key(config(), mesh) != key
    monkeypatch.setenv("XLA_FLAGS", "--xla_a=1 --xla_b=2")
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_scoped_vmem_limit_kib=98304")
    assert search_key(config(), mesh) != key
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    monkeypatch.setattr(remat_search, "source_digest", lambda: "another")
    assert search_key(config(), mesh) != key
    assert {"olmax", "jax", "jaxlib"} <= set(key["versions"])

    # the code's digest: of every module's path and contents
    root = Path(remat_search.__file__).parents[1]
    copied = tmp_path / "olmax"
    shutil.copytree(root, copied, ignore=shutil.ignore_patterns("__pycache__"))
    digest = remat_search.tree_digest(copied)
    assert digest == remat_search.tree_digest(root)
    (copied / "fit" / "remat.py").write_text((copied / "fit" / "remat.py").read_text() + "\n# changed\n")
    assert remat_search.tree_digest(copied) != digest


def test_an_lm_record_is_not_read_for_a_dpo_step(monkeypatch, tmp_path):
    """The same shapes under trainer.objective=dpo hold twice the rows: the DPO run searches for its own
    choice instead of taking the LM run's. A longer run with another learning rate reads its record."""
    done = scripted(monkeypatch, V5P_4X4X4)
    mesh = make_mesh(config().mesh)
    choose_remat(config(), mesh, V5P, "8 cpu devices", {}, tmp_path)
    searched = len(done)
    choose_remat(config("trainer.max_steps=100", "optimizer.lr=1e-4"), mesh, V5P, "8 cpu devices", {}, tmp_path)
    assert len(done) == searched
    choose_remat(config("trainer.objective=dpo"), mesh, V5P, "8 cpu devices", {}, tmp_path)
    assert len(done) == 2 * searched and len(json.loads((tmp_path / RECORD_FILE).read_text())) == 2


def test_a_shared_folder_that_cannot_hold_the_record_is_a_warning(monkeypatch, tmp_path, capsys):
    """The compilation cache's folder is a file (as a folder made unusable after the start would be):
    the search's record cannot be read or kept there, which is said in one line each, and the run
    goes on with its choice and its record in the run directory."""
    import jax

    done = scripted(monkeypatch, V5P_4X4X4)
    monkeypatch.setattr(remat, "chip_of_device", lambda device: V5P)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(blocked))
    try:
        choice = choose_for_devices(config(), make_mesh(config().mesh), str(tmp_path / "run"))
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    assert choice.cfg.model.remat != "auto" and len(done) == 5 and (tmp_path / "run" / RECORD_FILE).exists()
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(err) == 2
    assert err[0].startswith(f"warning: the record of model.remat=auto in {blocked} cannot be read")
    assert err[1].startswith(f"warning: the record of model.remat=auto cannot be kept in {blocked}")
