"""Config: presets, dotted overrides with type checking, YAML round trip, the CLI's dry-run view."""

import dataclasses
import importlib
import math
import pkgutil
import re
import subprocess
import sys

import pytest
from reference_values import STAGE1_LR

from olmax import config
from olmax.config import io as config_io
from olmax.config.dpo import DPOConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.io import apply_overrides, from_dict, load_yaml, save_yaml
from olmax.config.mesh import MeshConfig
from olmax.config.model import ModelConfig
from olmax.config.recipes import RECIPES, get_recipe, resolve
from olmax.config.trainer import TrainerConfig
from olmax.errors import ConfigError


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_round_trips_through_yaml(name, tmp_path):
    cfg = get_recipe(name)
    save_yaml(cfg, tmp_path / "c.yaml")
    assert load_yaml(tmp_path / "c.yaml") == cfg


def test_overrides_are_typed_and_nested():
    cfg = apply_overrides(get_recipe("tiny"), ["model.n_layers=6", "optimizer.lr=1e-3", "data.paths=[a,b]"])
    assert cfg.model.n_layers == 6 and isinstance(cfg.model.n_layers, int)
    assert cfg.optimizer.lr == 1e-3
    assert cfg.data.paths == ("a", "b")
    assert get_recipe("tiny").model.n_layers == 4  # presets are not mutated
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.n_layers = 3


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.n_layerz=6", "n_layerz"),
        ("model.n_layers=six", r"model.n_layers takes int, got 'six' \(.*could not be converted to Integer"),
        ("optimizer.lr=abc", "optimizer.lr takes float, got 'abc'"),
        ("trainer.micro_batch_size=[2]", r"trainer.micro_batch_size takes Optional\[int\], got \[2\]"),
        ("data.paths=3", r"data.paths takes tuple\[str, ...\], got 3"),
        (
            "checkpoint.keep_steps=[x]",
            r"^checkpoint.keep_steps=\[x\]: a list element could not be converted to Integer",
        ),
        ("model.attention=flash", "model.attention='flash' is not one of"),
        ("model.n_kv_heads=3", "not a multiple of model.n_kv_heads=3"),
        ("model.n_layers", "not of the form key=value"),
    ],
)
def test_bad_overrides_name_the_problem(override, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(get_recipe("tiny"), [override])


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.n_kv_heads=0", "model.n_kv_heads must be positive, got 0"),  # not a ZeroDivisionError
        ("trainer.global_batch=0", "trainer.global_batch must be positive, got 0"),
        ("trainer.micro_batch_size=0", "trainer.micro_batch_size must be positive, got 0"),
        ("trainer.max_steps=-1", "trainer.max_steps must be positive, got -1"),
        ("trainer.loss_chunk=24", "trainer.loss_chunk=24 does not divide data.seq_len=256"),
        ("data.seq_len=0", "data.seq_len must be positive, got 0"),
        ("data.max_target_seq_len=300", "data.max_target_seq_len=300 must be a multiple of data.seq_len=256"),
        ("optimizer.lr=-0.001", "optimizer.lr must be positive, got -0.001"),
        ("optimizer.b2=1.0", r"optimizer.b2 must be in \[0, 1\), got 1.0"),
        ("optimizer.skip_window=1", "optimizer.skip_window must be >= 2, got 1"),
        ("checkpoint.every=0", "checkpoint.every must be positive, got 0"),
        ("checkpoint.keep=0", "checkpoint.keep must be positive, got 0"),
        ("eval.batches=0", "eval.batches must be positive, got 0"),
    ],
)
def test_values_the_trainer_would_refuse_are_config_errors(override, message):
    """What needs neither devices nor data is checked when the config is built, so `olmax config` and
    `olmax train --dry-run` refuse it as the trainer does (test_cli_prints_resolved_config_and_rejects_typos)."""
    with pytest.raises(ConfigError, match=message):
        apply_overrides(get_recipe("tiny"), [override])


def test_resolve_needs_exactly_one_source(tmp_path):
    with pytest.raises(ConfigError, match="exactly one"):
        resolve(None, None)
    with pytest.raises(ConfigError, match="unknown recipe 'tinyy'"):
        resolve("tinyy", None)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve(None, str(tmp_path / "missing.yaml"))
    save_yaml(get_recipe("bench-small"), tmp_path / "b.yaml")
    assert resolve(None, str(tmp_path / "b.yaml"), ["trainer.max_steps=3"]).trainer.max_steps == 3


def test_padded_vocab_and_window_pattern():
    m = get_recipe("olmo3_7b").model
    assert m.padded_vocab_size == 100352
    assert [i for i in range(32) if m.layer_window(i) is None] == list(range(3, 32, 4))
    six = dataclasses.replace(get_recipe("tiny").model, n_layers=6)
    assert [six.layer_window(i) for i in range(6)] == [64, 64, 64, None, 64, None]  # last layer forced global
    assert dataclasses.replace(ExperimentConfig().model, remat="auto") == m  # the recipe adds remat (memory)


def test_cli_prints_resolved_config_and_rejects_typos(tmp_path, monkeypatch, capsys):
    """`olmax config` and `olmax train --dry-run`: the exit status and stderr of the `olmax` process for a
    typo and for a value the trainer refuses; the rest through the same entry point (olmax.cli.main) in
    this process, each `olmax` process costing a second of imports."""
    from olmax.cli import main

    def olmax(*args) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["olmax", *args])
        with pytest.raises(SystemExit) as ended:
            main()
        out = capsys.readouterr()
        return ended.value.code, out.out, out.err

    process = lambda *args: subprocess.run([sys.executable, "-m", "olmax.cli", *args], capture_output=True, text=True)
    code, out, _ = olmax("config", "--recipe", "tiny", "model.n_layers=6")
    assert code == 0 and "n_layers: 6" in out and "name: tiny" in out
    code, out, _ = olmax("config", "--recipe", "tiny", "model.n_layers=6", "--save", str(tmp_path / "c.yaml"))
    assert (code, out) == (0, f"wrote the resolved config to {tmp_path / 'c.yaml'}\n")  # one line, not the YAML
    assert load_yaml(tmp_path / "c.yaml").model.n_layers == 6
    bad = process("config", "--recipe", "tiny", "model.n_layerz=6")
    assert bad.returncode == 2 and "n_layerz" in bad.stderr
    code, _, err = olmax("config", "--recipe", "tiny", "model.n_layers=two")
    assert code == 2 and "config error: model.n_layers takes int, got 'two'" in err
    # what the trainer refuses, `olmax config` and `olmax train --dry-run` refuse with the same message
    refused = "config error: trainer.global_batch must be positive, got 0\n"
    assert olmax("config", "--recipe", "tiny", "trainer.global_batch=0")[::2] == (2, refused)
    zero = process(
        "train", "--run-dir", str(tmp_path / "run"), "--dry-run", "--recipe", "tiny", "trainer.global_batch=0"
    )
    assert (zero.returncode, zero.stderr) == (2, refused), zero.stderr
    assert not (tmp_path / "run").exists()


def _config_dataclasses():
    """Every config dataclass of every module of the config package."""
    modules = [importlib.import_module(f"olmax.config.{m.name}") for m in pkgutil.iter_modules(config.__path__)]
    return [
        obj
        for module in modules
        for obj in vars(module).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
    ]


def test_every_config_field_has_help():
    classes = _config_dataclasses()
    assert ExperimentConfig in classes and ModelConfig in classes and DPOConfig in classes
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in classes
        for f in dataclasses.fields(cls)
        if not config_io.field_help(cls).get(f.name)
    ]
    assert not missing, f"config fields without an attribute docstring: {missing}"
    # --explain lists every leaf field, each with its help
    assert all(fi.help for fi in config_io.explain_fields(ExperimentConfig()))


@dataclasses.dataclass(frozen=True)
class _Documented:
    a: int = 1
    """Help of a,
    over two lines."""
    b: int = 2
    c: str = "x"  # a comment is not help
    d: float = 0.5
    """Help of d."""


def test_field_help_reads_attribute_docstrings_only():
    assert config_io.field_help(_Documented) == {"a": "Help of a, over two lines.", "d": "Help of d."}


def test_cli_explains_fields():
    from typer.testing import CliRunner

    from olmax.cli.common import app

    run = CliRunner().invoke(
        app,
        [
            "config",
            "--recipe",
            "olmo3_7b_stage3",
            "--explain",
            "model.rope_type",
            "trainer.max_steps=7",
            "trainer.max_",
        ],
    )
    assert run.exit_code == 0, run.output
    blocks = [block.split("\n", 1) for block in re.split(r"\n(?=\S)", run.output.strip())]
    assert [(head, " ".join(body.split())) for head, body in blocks] == [
        ('model.rope_type: str = "yarn"', config_io.field_help(ModelConfig)["rope_type"]),
        ("trainer.max_steps: Optional[int] = 7", config_io.field_help(TrainerConfig)["max_steps"]),
    ]
    everything = CliRunner().invoke(app, ["config", "--explain"])  # no recipe: the dataclass defaults
    names = [line.split(":")[0] for line in everything.output.splitlines() if not line.startswith(" ")]
    assert names == [fi.name for fi in config_io.explain_fields(ExperimentConfig())] and "wandb.mode" in names
    with pytest.raises(ConfigError, match="no config field starts with 'modl'"):
        config_io.explain_fields(ExperimentConfig(), ["modl"])


# The stage-1 LR check values (STAGE1_LR) go through the recipes' own schedules below (float32: 2e-6 relative).
def _recipe_schedule(name, overrides=()):
    from olmax.step.schedules import make_schedule

    cfg = resolve(name, None, list(overrides))
    return cfg, make_schedule(
        cfg.schedule,
        lr=cfg.optimizer.lr,
        max_steps=cfg.trainer.max_steps,
        tokens_per_step=cfg.trainer.global_batch * cfg.data.seq_len,
    )


@pytest.mark.parametrize("name", ["olmo3_7b", "olmo3_7b_stage1"])
def test_stage1_recipes_give_the_reference_learning_rates(name):
    _, lr = _recipe_schedule(name)
    for step, expected in STAGE1_LR:
        assert float(lr(step)) == pytest.approx(expected, rel=2e-6), step


def test_stage1_single_cosine_override_is_maxtexts_schedule():
    _, lr = _recipe_schedule("olmo3_7b_stage1", ["schedule.name=cosine", "schedule.t_max_tokens=7000000000000"])
    t_max, peak = 1_668_931, 3e-4  # ceil(7e12 / 4194304)
    for step in (2000, 597_047, 1_000_000, t_max):
        expected = 3e-5 + (peak - 3e-5) * (1 + math.cos(math.pi * (step - 2000) / (t_max - 2000))) / 2
        assert float(lr(step)) == pytest.approx(expected, rel=2e-6), step
    assert float(lr(1000)) == pytest.approx(1.5e-4, rel=2e-6)


def test_stage2_and_stage3_recipes():
    cfg, lr = _recipe_schedule("olmo3_7b_stage2")
    assert (cfg.trainer.global_batch, cfg.data.seq_len, cfg.trainer.max_steps, cfg.data.seed) == (
        256,
        8192,
        47_684,
        1337,
    )
    assert cfg.data.max_target_seq_len == 8192  # the midtrain script's max_target_sequence_length
    assert cfg.trainer.max_steps == math.ceil(100e9 / 2**21)
    peak = 2.0712352850360292e-4
    assert float(lr(1)) == pytest.approx(peak * (1 - 1 / 47_684), rel=2e-6)  # no warmup: step 1 already decays
    assert float(lr(23_842)) == pytest.approx(peak / 2, rel=2e-6)
    assert float(lr(47_684)) == 0.0
    cfg, lr = _recipe_schedule("olmo3_7b_stage3")
    assert (cfg.trainer.global_batch, cfg.data.seq_len, cfg.data.seed) == (64, 65536, 34521)
    assert (cfg.model.rope_type, cfg.model.yarn_factor, cfg.model.max_position) == ("yarn", 8.0, 65536)
    # the data as AI2 packed it (NumpyPackedFSLDatasetConfig), masked within documents, absolute positions
    data = cfg.data
    assert (data.packing, data.source_group_size, data.source_permutation_seed) == ("obfd", 8, 123)
    assert data.doc_masking and cfg.model.rope_positions == "absolute"
    assert (cfg.mesh.context, cfg.model.remat) == (2, "auto")
    # AI2's released stage-3 checkpoint is step 11,921: 50B tokens of 2^22 per step
    assert cfg.trainer.max_steps == 11_921 == math.ceil(50e9 / 2**22)
    assert float(lr(100)) == pytest.approx(peak / 2, rel=2e-6)  # the long-context script's LR is stage 2's
    assert float(lr(200)) == pytest.approx(peak, rel=2e-6)
    assert float(lr(11_921)) == 0.0


@pytest.mark.parametrize("name", ["olmo3_32b", "olmo3_32b_stage1"])
def test_32b_stage1_recipe(name):
    """The numbers of OLMo-core's OLMo-3-1025-32B-pretrain.py, and the step the 32B stage 2 loads."""
    cfg = resolve(name, None, [])
    assert (cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads, cfg.model.n_kv_heads) == (64, 5120, 40, 8)
    assert cfg.model.mlp_hidden == 27648
    assert cfg.trainer.global_batch * cfg.data.seq_len == 8 * 1024 * 1024  # GLOBAL_BATCH_SIZE, tokens
    assert (cfg.trainer.global_batch, cfg.data.seq_len, cfg.data.max_target_seq_len) == (1024, 8192, 8192)
    assert (cfg.data.seed, cfg.data.instance_filter, cfg.data.packing) == (34521, True, "none")
    opt = cfg.optimizer
    assert (opt.lr, opt.weight_decay, opt.b1, opt.b2, opt.z_loss, opt.max_grad_norm) == (
        6e-4,
        0.1,
        0.9,
        0.95,
        1e-5,
        1.0,
    )
    assert opt.no_decay == ("embed",) and opt.skip_step  # SkipStepAdamW, embeddings without weight decay
    assert (cfg.schedule.name, cfg.schedule.warmup_steps, cfg.schedule.alpha_f) == ("cosine", 2000, 0.1)
    # max_duration=Duration.epochs(1): the cosine ends with the epoch, whose batch count the data gives
    assert (cfg.schedule.t_max_epochs, cfg.schedule.t_max_tokens) == (1, None)
    assert cfg.trainer.max_steps == 656_000  # stego32-highlr-filter3/step656000, both ingredients' load_path
    with pytest.raises(ConfigError, match="t_max_epochs=1 sets the horizon from the batches in an epoch"):
        _recipe_schedule(name)
    from olmax.step.schedules import make_schedule

    epoch = 700_000  # a stand-in batch count; the real one is OLMo-mix-0925-official's instances // 1024
    lr = make_schedule(
        cfg.schedule, lr=opt.lr, max_steps=cfg.trainer.max_steps, tokens_per_step=2**23, epoch_batches=epoch
    )
    assert float(lr(1000)) == pytest.approx(3e-4, rel=2e-6) and float(lr(2000)) == pytest.approx(6e-4, rel=2e-6)
    middle = 2000 + (epoch - 2000) // 2
    assert float(lr(middle)) == pytest.approx((6e-4 + 6e-5) / 2, rel=2e-6)
    assert float(lr(epoch)) == pytest.approx(6e-5, rel=2e-6)


def test_32b_stage2_and_stage3_recipes():
    """The numbers of OLMo-core's OLMo-3-1025-32B-midtrain-ingredient-1/2.py and -32B-long-context.py."""
    peak = 0.0002071235285  # the scripts' LR literal
    cfg, lr = _recipe_schedule("olmo3_32b_stage2")
    assert (cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads, cfg.model.n_kv_heads) == (64, 5120, 40, 8)
    assert cfg.trainer.global_batch * cfg.data.seq_len == 4 * 1024 * 1024  # GLOBAL_BATCH_SIZE, tokens
    assert cfg.trainer.max_steps == 23_842 == math.ceil(100e9 / (4 * 1024 * 1024))  # MAX_TOKENS 100B
    assert (cfg.data.seq_len, cfg.data.max_target_seq_len, cfg.data.seed, cfg.data.instance_filter) == (
        8192,
        8192,
        42069,
        True,
    )
    assert cfg.optimizer.lr == peak and (cfg.optimizer.weight_decay, cfg.optimizer.z_loss) == (0.1, 1e-5)
    assert float(lr(1)) == pytest.approx(peak * (1 - 1 / 23_842), rel=2e-6)  # warmup=0, alpha_f=0
    assert float(lr(23_842)) == 0.0
    cfg, lr = _recipe_schedule("olmo3_32b_stage3")
    assert cfg.trainer.global_batch * cfg.data.seq_len == 8 * 1024 * 1024
    assert cfg.trainer.max_steps == 11_921 == math.ceil(100e9 / (8 * 1024 * 1024))
    assert (cfg.data.seq_len, cfg.data.seed, cfg.data.instance_filter, cfg.data.packing) == (65536, 34521, True, "obfd")
    assert (cfg.data.source_group_size, cfg.data.source_permutation_seed, cfg.data.doc_masking) == (8, 123, True)
    model = cfg.model
    assert (model.rope_type, model.yarn_factor, model.yarn_beta_fast, model.yarn_beta_slow) == ("yarn", 8.0, 32.0, 1.0)
    assert (model.yarn_original_max_position, model.max_position, model.rope_positions) == (8192, 65536, "absolute")
    assert float(lr(100)) == pytest.approx(peak / 2, rel=2e-6)  # warmup=200
    assert float(lr(200)) == pytest.approx(peak, rel=2e-6)
    assert float(lr(11_921)) == 0.0


def test_remat_takes_a_policy_name_or_a_set_of_tags():
    from olmax.config.remat import REMAT_POLICIES, RematPolicy, remat_policy_of

    assert remat_policy_of("save_qkv_proj") == REMAT_POLICIES["save_qkv_proj"]
    # tags in any order and spacing, kept in the block's order
    m = apply_overrides(ExperimentConfig(), ["model.remat=attn_context, q_proj,k_proj,v_proj"]).model
    assert remat_policy_of(m.remat) == RematPolicy(save=("q_proj", "k_proj", "v_proj", "attn_context"))
    # a YAML list of tags, in an override or a file, is the same set
    m = apply_overrides(ExperimentConfig(), ["model.remat=[attn_context, q_proj]"]).model
    assert m.remat == "attn_context,q_proj"
    assert from_dict({"model": {"remat": ["mlp_down", "layer_input"]}}).model.remat == "mlp_down,layer_input"
    with pytest.raises(ConfigError, match=r"model.remat='q_proj,qkv': unknown tag 'qkv'"):
        apply_overrides(ExperimentConfig(), ["model.remat=[q_proj, qkv]"])
    with pytest.raises(ConfigError, match=r"model.remat='q_proj,qkv': unknown tag 'qkv'; .* layer_input, q_proj"):
        apply_overrides(ExperimentConfig(), ["model.remat=q_proj,qkv"])
    with pytest.raises(
        ConfigError, match=r"model.remat='save_all': unknown tag 'save_all'; give auto, a policy \(none, full"
    ):
        apply_overrides(ExperimentConfig(), ["model.remat=save_all"])
    # auto chooses the backward pass's order as well
    assert apply_overrides(ExperimentConfig(), ["model.remat=auto"]).model.remat == "auto"
    with pytest.raises(ConfigError, match="model.remat_serial=true with model.remat=auto"):
        apply_overrides(ExperimentConfig(), ["model.remat=auto", "model.remat_serial=true"])


def test_an_fsdp_axis_that_does_not_divide_d_model_is_refused():
    """FSDP shards the parameters over d_model: an fsdp axis of 6 cannot split 128, so the training
    state would be whole on every device; the layout is refused, naming one that divides it (as 96 GPUs
    cannot split the 32B's 5120: HSDP in 3 groups of 32). Parameters alone (evaluation) are still laid
    out, what does not divide kept whole."""
    import jax

    from olmax.model.olmo3 import param_shardings
    from olmax.model.sharding import make_mesh
    from olmax.step.state import state_shardings

    cfg = get_recipe("tiny")
    assert cfg.model.d_model == 128
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1), jax.devices()[:6])
    with pytest.raises(ConfigError, match=r"mesh.fsdp=6 does not divide model.d_model=128.*mesh.data=3 mesh.fsdp=2"):
        state_shardings(cfg, mesh)
    param_shardings(cfg.model, mesh)
    state_shardings(cfg, make_mesh(MeshConfig(data=3, fsdp=2, tensor=1), jax.devices()[:6]))
    odd = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, d_model=127))
    with pytest.raises(ConfigError, match=r"mesh.data=3 mesh.fsdp=1 \(data parallelism\)"):
        state_shardings(odd, make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1), jax.devices()[:3]))
