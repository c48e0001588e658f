"""On a real TPU chip: what only the chip can show. Every test is marked `tpu` and conftest.py skips
it wherever JAX's default backend is not a TPU. Run them alone, in ONE process (the chip takes one
process at a time; no -n): `python -m pytest -m tpu tests/test_tpu.py` on a TPU host.

- compile-check's predicted peak (olmax.fit.compile_check) is the chip's measured peak of the same
  compiled step, within 10%;
- splash attention (the Mosaic kernel, not Pallas's interpreter) = the `xla` backend on the chip,
  output and q/k/v gradients: causal (bf16), and windowed within documents, GQA 8/2, 2048 tokens,
  head_dim 128, bf16 at the production tiles and fp32 at tiles that make the kernel skip blocks;
- the `tiny` recipe's production train step on the chip follows the CPU's over 20 steps of the demo
  corpus from the same initialisation (cross-entropy per step, at default and highest matmul precision);
- a training checkpoint written from the chip restores on the CPU bit for bit, and the reverse;
- greedy `olmax generate` on the chip writes the CPU's tokens;
- the slot engine (olmax.rollout.engine) on the chip gives the static sampler's greedy tokens there;
- the decode kernel (olmax.rollout.decode_attention, Mosaic) = its XLA path on the chip, outputs and the
  cache it writes, on rings and on a paged pool; the slot engine on a paged cache whose rows are
  preempted, decoding through the kernel, gives the static sampler's greedy tokens.

Precision: at default precision the TPU multiplies float32 matrices in one bfloat16 pass (~3 digits),
under `jax.default_matmul_precision("highest")` to ~7 digits; each tolerance below says which it allows for.
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from small_run import SMALL, tokenized_demo
from typer.testing import CliRunner

from olmax.checkpoint.store import RunCheckpoints, load_params, save_params
from olmax.cli.common import app
from olmax.config.model import SplashBlocks
from olmax.config.recipes import resolve
from olmax.data.loader import make_loader
from olmax.fit import compiler
from olmax.model import attention as attn
from olmax.model.olmo3 import init_params, param_shardings
from olmax.model.sharding import make_mesh
from olmax.step.state import abstract_state, init_train_state, state_shardings
from olmax.step.train_step import batch_sharding, make_train_step

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from chip_memory import chip_holds  # noqa: E402 - the throughput table's measure of the same

pytestmark = pytest.mark.tpu

GIB = 2**30


def _chip():
    """The TPU chip: the default backend's device (conftest.py skips these tests where it is not a TPU)."""
    return jax.devices()[0]


def _cpu():
    return jax.devices("cpu")[0]


# ---------------------------------------------------------------------------------------------------
# compile-check's memory figure against the chip's

# The tiny model scaled up (d_model 512, heads of 128, 1024 tokens in bf16): a step whose peak is a few
# GiB, so the runtime's fixed overheads (MiB) do not blur it, and above every other program of this file.
MEMORY_STEP = [
    "model.d_model=512",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.head_dim=128",
    "model.mlp_hidden=1536",
    "model.max_position=1024",
    "model.compute_dtype=bfloat16",
    "data.seq_len=1024",
]


FILLER_BLOCK = 32 * 2**20  # the filler's unit: the measurement's resolution (1.4% of this step's 2.2 GiB)


def test_compile_check_peak_is_the_chips_peak():
    """compile-check's figure of what the chip holds for the step (`memory_of(...)["hbm_gib"]`: the TPU
    compiler's heap, the span its buffer assignment lays arguments, outputs and temporaries out in,
    plus the program's code) against the HBM the same compiled step takes on the chip: the chip's
    limit less the largest filler (blocks of FILLER_BLOCK, found by bisection) beside which the step
    still runs from a fresh state, less what was in use before the step was compiled (chip_holds, the
    throughput benchmark's --chip-holds). That counts
    whatever the runtime holds for the step, whenever it takes it (the heap may be set aside when the
    program is loaded, before any argument exists), which the allocator's high-water mark does not: on
    a v5e it rose by 1.38 GiB for this step, its arguments alone 1.29 GiB. Measured there (libtpu
    0.0.42.1): 2.311 GiB with RoPE's halves swapped by a reshape and reverse, 2.404 GiB with the roll
    olmax uses; the heap and code were 2.297 and 2.386 GiB (AOT for a v5e, the same compiler), XLA's peak
    2.181 GiB for both (the roll's temporaries pack less tightly: 9% under what the chip held). The 10%
    bound holds a miscount of a whole class of buffers (the temporaries: 40%) out. This test runs first
    in the file, so that no earlier program holds memory the figures would count."""
    chip = _chip()
    cfg = resolve("tiny", None, MEMORY_STEP)
    start = chip.memory_stats()
    devices, chip_type, where = compiler.target(devices=[chip])
    mesh = make_mesh(cfg.mesh, devices)
    compiled, _, _, heap = compiler.compile_step(cfg, mesh, compiler.target_options(chip_type, "tpu"), where)
    memory = compiler.memory_of(compiled, heap, chip_type.hbm_limit_gib)
    predicted = memory["hbm_gib"]
    assert predicted is not None, "compile-check read no heap from the TPU compiler's memory-usage report"
    loaded = chip.memory_stats()
    shape = (cfg.trainer.global_batch, cfg.data.seq_len)
    tokens = np.random.default_rng(0).integers(0, cfg.model.vocab_size, shape, dtype=np.int32)

    def step():
        """A fresh state, one step."""
        with jax.set_mesh(mesh):
            state = init_train_state(cfg, mesh, jax.random.key(0))
        jax.block_until_ready(compiled(state, {"input_ids": jax.device_put(tokens, batch_sharding(cfg, mesh))}))

    step()
    high_water = chip.memory_stats()["peak_bytes_in_use"] - start["bytes_in_use"]
    measured = chip_holds(step, start, FILLER_BLOCK)
    figures = {
        "predicted_gib": round(predicted, 3),
        "xla_peak_gib": round(memory["peak_gib"], 3),
        "measured_gib": round(measured, 3),
        "resolution_gib": FILLER_BLOCK / GIB,
        "high_water_gib": round(high_water / GIB, 3),
        "loaded_program_gib": round((loaded["bytes_in_use"] - start["bytes_in_use"]) / GIB, 3),
    }
    print("compile-check peak vs the chip:", json.dumps(figures))
    assert abs(measured - predicted) <= 0.10 * predicted, figures


# ---------------------------------------------------------------------------------------------------
# splash attention on the chip against the xla backend on the chip

SEQ, BATCH, HEADS, KV_HEADS, HEAD_DIM, WINDOW = 2048, 2, 8, 2, 128, 512
# Row 0: three documents and a padding segment, every boundary off the tile edges; row 1: one document.
DOCS = [[300, 1100, 600, 48], [2048]]
# Each array (output, dq, dk, dv) is compared within a fraction of its largest entry (|out| reaches 3.2,
# gradients 3-10). Measured on the CPU (splash in interpret mode, the same inputs):
# - bfloat16: splash and xla each round p and the output to bf16; they differ by up to 1.6e-2 in the
#   output (one bf16 ulp at |out| in [2, 4), 0.5% of its largest entry) and 0.7% in the gradients,
#   as each differs from the float32 result. 2^-6 (1.6%) of the largest entry holds that with room.
# - float32 under "highest": 2.1e-6 (outputs) and 1e-6 (gradients) of the largest entry, summation
#   order alone; 5e-5 leaves 25x for the chip's own exp and its multi-pass float32 products.
# A window one key too wide moves outputs by 4% of their largest entry (0.138) and a document boundary
# moved by one token by 100% (3.28): the xla backend on the CPU, the same inputs. Both tolerances
# catch the first, float32's by 800x.
ATTENTION_TOL = {"bfloat16": 2**-6, "float32": 5e-5}
# bf16 at the production tiles (2048/2048/1024: one tile per sequence, the chip profile's 64 MiB of
# scoped VMEM); float32 at 512/512/256 tiles, where the window and the documents leave whole tiles
# out: the kernel's block skipping under the tightest tolerance. The plain causal mask, and the window
# within documents (the mask of the windowed layers with data.doc_masking). Not float32 causal: the xla
# backend's global backward pass at "highest" compiles 5x longer than the others (8 band widths, 6-pass
# products: 505 s against 17-136 s for the rest, compiled for v5e on a loaded 2-core host).
ATTENTION_CASES = [
    ("bfloat16", None, False),
    ("bfloat16", WINDOW, True),
    ("float32", WINDOW, True),
]
TILES = {"bfloat16": SplashBlocks(), "float32": SplashBlocks(512, 512, 256)}


def _attention_with_grads(backend, q, k, v, w, segments, window, blocks):
    """(output, (dq, dk, dv), compiled HLO text) of sum(w * attention) for one backend, jitted."""

    def loss(q, k, v, w, segments):
        out = attn.attention(q, k, v, window=window, backend=backend, splash_blocks=blocks, segments=segments)
        return jnp.sum(w * out.astype(jnp.float32)), out

    args = (q, k, v, w, segments)
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)).lower(*args).compile()
    (_, out), grads = compiled(*args)
    return out, grads, compiled.as_text()


@pytest.mark.parametrize(
    "dtype, window, documents",
    ATTENTION_CASES,
    ids=[f"{d}-{'window' if w else 'global'}-{'docs' if docs else 'nodocs'}" for d, w, docs in ATTENTION_CASES],
)
def test_splash_matches_xla_on_the_chip(dtype, window, documents):
    rng = np.random.default_rng(0)
    q, k, v = (
        jnp.asarray(rng.standard_normal((BATCH, SEQ, n, HEAD_DIM), np.float32), dtype)
        for n in (HEADS, KV_HEADS, KV_HEADS)
    )
    w = jnp.asarray(rng.standard_normal(q.shape, np.float32))  # a loss that weighs every output differently
    segments = None
    if documents:
        segments = attn.segment_ids(jnp.asarray([lens + [0] * (SEQ - len(lens)) for lens in DOCS], jnp.int32))
    precision = jax.default_matmul_precision("highest") if dtype == "float32" else contextlib.nullcontext()
    with precision:
        out, grads, hlo = _attention_with_grads("splash", q, k, v, w, segments, window, TILES[dtype])
        want_out, want_grads, _ = _attention_with_grads("xla", q, k, v, w, segments, window, None)
    assert compiler.MOSAIC_CALL in hlo  # the kernel compiled by Mosaic, not Pallas's interpreter
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (want_out, *want_grads), strict=True):
        assert got.dtype == want.dtype == jnp.dtype(dtype), name
        want = np.asarray(want, np.float32)
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(
            np.asarray(got, np.float32), want, atol=ATTENTION_TOL[dtype] * scale, rtol=0, err_msg=name
        )


# ---------------------------------------------------------------------------------------------------
# the tiny recipe's train step: chip against CPU

STEPS = 20
# Largest |ce_chip - ce_cpu| / ce_cpu over the 20 steps, from measurements on the CPU (the chip's own
# figures are to be confirmed). The CE falls from 11.5 to 6.7 over these steps, not monotonically (lr 3e-3).
# - default precision: the chip rounds every float32 matmul input to bf16. The same 20 steps on the CPU
#   with model.compute_dtype=bfloat16 (every matmul input AND activation rounded to bf16: more rounding
#   than the chip's) differ from float32 by at most 2.8e-4 per step; the bound is 10x that.
# - highest: float32 products to ~7 digits. The same steps summed in another order on the CPU (8
#   accumulation steps of one row against one step of 8 rows) differ by at most 7.9e-7; 3e-5 allows ~40x
#   that for the chip's own exp, log and products, and stays 10x below the bf16 gap.
CE_GAP = {"default": 3e-3, "highest": 3e-5}


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """(config, initial parameters as numpy, the 20 batches, the CPU's CE per step): the tiny recipe on
    the demo corpus, initialised once on the CPU (so both sides start from the same bits)."""
    work_dir = tmp_path_factory.mktemp("tiny") / "cache"
    shutil.copytree(tokenized_demo(), work_dir / "demo")
    cfg = resolve("tiny", None, [f"data.work_dir={work_dir}"])
    batches = iter(make_loader(cfg.data, cfg.trainer.global_batch))
    batches = [next(batches)["input_ids"] for _ in range(STEPS)]
    with jax.default_device(_cpu()):
        params = jax.device_get(jax.jit(init_params, static_argnums=0)(cfg.model, jax.random.key(cfg.trainer.seed)))
    ce = _train(cfg, _cpu(), params, batches)
    assert ce[-1] < ce[0] - 1.0, ce  # the model learns: the runs are compared along a moving trajectory
    return cfg, params, batches, ce


def _train(cfg, device, params, batches) -> np.ndarray:
    """The production step (olmax.step.train_step) on a one-device mesh of `device`: CE per step."""
    mesh = make_mesh(cfg.mesh, [device])
    ce = []
    with jax.default_device(device), jax.set_mesh(mesh):
        state = init_train_state(cfg, mesh, jax.random.key(cfg.trainer.seed), params=params)
        step = make_train_step(cfg, mesh)
        for ids in batches:
            state, metrics = step(state, {"input_ids": jax.device_put(ids, batch_sharding(cfg, mesh))})
            ce.append(float(metrics["ce_loss"]))
    return np.array(ce)


@pytest.mark.parametrize("precision", ["default", "highest"])
def test_tiny_train_step_on_the_chip_follows_the_cpu(cpu_run, precision):
    cfg, params, batches, cpu_ce = cpu_run
    with jax.default_matmul_precision(precision):
        chip_ce = _train(cfg, _chip(), params, batches)
    gap = np.abs(chip_ce - cpu_ce) / cpu_ce
    assert gap.max() <= CE_GAP[precision], f"per-step relative CE gap {np.array2string(gap, precision=2)}"


# ---------------------------------------------------------------------------------------------------
# checkpoints between the chip and the CPU


def _random_state(cfg, mesh, seed: int):
    """A TrainState of numpy arrays shaped as the run's, every entry random (no two leaves alike)."""
    rng = np.random.default_rng(seed)

    def fill(a):
        if jnp.issubdtype(a.dtype, jnp.floating):
            return rng.standard_normal(a.shape).astype(a.dtype)
        return rng.integers(0, 1000, a.shape).astype(a.dtype)

    return jax.tree.map(fill, abstract_state(cfg, mesh))


def _same_bits(got, want, where: str):
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True):
        name = f"{where}{jax.tree_util.keystr(path)}"
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert g.tobytes() == w.tobytes(), name


@pytest.mark.parametrize("direction", ["chip-to-cpu", "cpu-to-chip"])
def test_checkpoint_restores_bit_for_bit_across_chip_and_cpu(tmp_path, direction):
    """A run checkpoint (params, optimizer moments, step and skip window: RunCheckpoints) saved from
    arrays on one device kind, restored onto the other's shardings; its params also through
    load_params, as `olmax generate` and the evals read them."""
    cfg = resolve("tiny", None, SMALL)
    chip, cpu = make_mesh(cfg.mesh, [_chip()]), make_mesh(cfg.mesh, [_cpu()])
    source, target = (chip, cpu) if direction == "chip-to-cpu" else (cpu, chip)
    values = _random_state(cfg, source, seed=1 if direction == "chip-to-cpu" else 2)
    state = jax.device_put(values, state_shardings(cfg, source))
    ckpts = RunCheckpoints(tmp_path / "ckpt", cfg)
    ckpts.save(7, state, {"batches_processed": 7}, source)
    ckpts.close()

    ckpts = RunCheckpoints(tmp_path / "ckpt", cfg)
    restored, data_state = ckpts.restore(7, abstract_state(cfg, target))
    ckpts.close()
    assert data_state == {"batches_processed": 7}
    target_device = target.devices.flat[0]
    assert all(x.sharding.device_set == {target_device} for x in jax.tree.leaves(restored))
    _same_bits(restored, values, "state")
    params, _, _ = load_params(tmp_path / "ckpt", 7, shardings=param_shardings(cfg.model, target))
    assert all(x.sharding.device_set == {target_device} for x in jax.tree.leaves(params))
    _same_bits(params, values.params, "params")


# ---------------------------------------------------------------------------------------------------
# greedy generation: `olmax generate` on the chip and on the CPU

PROMPTS = ["The history of the", "def fibonacci(n):"]


def test_greedy_generate_on_the_chip_is_the_cpus(tmp_path):
    """The tiny model (float32, random init) from one checkpoint. The CPU side is `olmax generate` in a
    process of its own on JAX_PLATFORMS=cpu; the chip side is the same command run in this process
    (typer's runner), which already holds the chip: a second process could not open it, whatever ran
    before this test. Greedy tokens are argmaxes over 100k logits whose top two differ by ~1/20 of
    their spread on a random model; the chip's default precision (one bf16 pass per float32 matmul,
    ~3 digits) would flip a few percent of them, a difference of precision, not of the program. Under
    "highest" (~7 digits) a flip is ~1e-4 per token, so the tokens must be the same."""
    cfg = resolve("tiny", None, []).model
    with jax.default_device(_cpu()):
        params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
    ckpt = tmp_path / "ckpt"
    save_params(ckpt, params, cfg, {"source": "tests/test_tpu.py: random init"})
    args = ["generate", "--ckpt", str(ckpt), "--max-new-tokens", "32"]
    args += [arg for prompt in PROMPTS for arg in ("--prompt", prompt)]

    cpu = subprocess.run(
        [sys.executable, "-m", "olmax.cli", *args, "--json", str(tmp_path / "cpu.json")],
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cpu.returncode == 0, cpu.stderr
    with jax.default_matmul_precision("highest"):
        on_chip = CliRunner().invoke(app, [*args, "--json", str(tmp_path / "chip.json")])
    assert on_chip.exit_code == 0, on_chip.output

    cpu_rows, chip_rows = (json.loads((tmp_path / f"{side}.json").read_text())["results"] for side in ("cpu", "chip"))
    assert [r["ids"] for r in chip_rows] == [r["ids"] for r in cpu_rows]
    assert [r["text"] for r in chip_rows] == [r["text"] for r in cpu_rows]
    assert all(len(r["ids"]) == 32 or r["finish"] == "eos" for r in cpu_rows)


def test_slot_engine_on_the_chip_gives_the_static_samplers_tokens():
    """The slot engine's TPU-only paths: every program in the decoding loop's layout
    (olmax.rollout.slots.cache_formats), the insert's slabs under that layout's constraint, the drain's
    narrowed programs compiled ahead and kept where they fit (olmax.rollout.engine.fits), compact. 4
    slots for 6 ragged prompts x 3 greedy samples of up to 12 tokens on a 3-layer float32 model whose
    rings wrap, against the static sampler on the chip; under "highest" precision, a peaked output
    layer (argmaxes with wide margins), so the tokens must be the same and the log-probs close."""
    from models import random_params, small_model

    from olmax.rollout.engine import SlotEngine
    from olmax.rollout.sampler import Sampling, sample

    cfg = small_model(vocab_size=300, n_layers=3, global_every=2, sliding_window=4, compute_dtype="float32")
    params = random_params(cfg, jax.random.key(2))
    params["lm_head"] = params["lm_head"] * 20
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (3, 9, 5, 12, 7, 1)]
    limits = rng.integers(1, 13, len(prompts) * 3)
    limits[-3:] = (12, 2, 1)  # the last group's first row stops last: the drain narrows
    with jax.default_matmul_precision("highest"):
        want = sample(params, cfg, prompts, 12, n=3, sampling=Sampling(), limits=limits)
        engine = SlotEngine(cfg, slots=4, cache_len=24, sampling=Sampling(), chunk_steps=5, narrow=2)
        for i, p in enumerate(prompts):
            engine.add(p, 3, first_index=3 * i, limits=limits[3 * i : 3 * i + 3])
        finished = engine.run(params)
    tokens, logprobs, lengths = (np.asarray(x) for x in (want.tokens, want.logprobs, want.lengths))
    for f in finished:
        np.testing.assert_array_equal(f.tokens, tokens[f.index, : lengths[f.index]])
        np.testing.assert_allclose(f.logprobs, logprobs[f.index, : lengths[f.index]], atol=1e-4, rtol=0)
    assert engine.totals.moved_rows > 0 and int(engine._state.clock) > 24


# ---------------------------------------------------------------------------------------------------
# decode attention over the KV each row holds (olmax.rollout.decode_attention)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(12, 12, 64), (8, 2, 128)], ids=["mha-64", "gqa-128"])
def test_decode_kernel_on_the_chip_is_the_xla_path(dtype, heads, kv_heads, head_dim):
    """The Mosaic kernel against the XLA path (the whole ring, masked) on the chip: rings of 384 slots read
    in 3 blocks of 128, 8 rows holding one time, a few, a block and a half, or the whole ring (first
    times before 0 too), clocks before and after the rings wrap, on the ring layout and on a paged pool
    (the blocks at shuffled page ids, the rest noise); head_dim 64 (a head's key and value read as one
    128-lane row) and 128 (sliced at the lane tile). The cache each writes (the step's keys and values
    at slot clock % 384 of every row) is the same bit for bit; the outputs agree to float32 rounding
    under "highest" precision, and to two bfloat16 steps in bfloat16 (both round the probabilities to
    bfloat16 before the values' product, summing in float32 in their own orders)."""
    from olmax.rollout.decode_attention import attend

    ring, page, rows = 384, 128, 8
    rng = np.random.default_rng(0)
    cast = lambda x: jnp.asarray(x, jnp.dtype(dtype))
    step = jax.jit(attend, static_argnames=("ring", "implementation"))
    tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == "float32" else dict(atol=2e-2, rtol=2e-2)
    with jax.default_matmul_precision("highest"):
        for clock in (200, 700, 1000):
            first = np.asarray([clock, clock - 1, clock - 7, clock - 130, clock - 200, clock - 383, clock - 900, -5])
            first = np.minimum(first, clock).astype(np.int32)
            q = cast(rng.standard_normal((rows, heads, head_dim)))
            new = cast(rng.standard_normal((rows, kv_heads, 2 * head_dim)))
            rings = rng.standard_normal((rows, kv_heads, ring, 2 * head_dim)).astype(np.float32)
            ids = rng.permutation(2 * rows * 3)[: rows * 3].reshape(rows, 3).astype(np.int32)
            pool = rng.standard_normal((2 * rows * 3, kv_heads, page, 2 * head_dim)).astype(np.float32)
            pool[ids] = rings.reshape(rows, kv_heads, 3, page, 2 * head_dim).transpose(0, 2, 1, 3, 4)
            for cache, table in ((rings, None), (pool, ids)):
                table = None if table is None else jnp.asarray(table)
                out = {}
                for implementation in ("xla", "pallas"):
                    args = (q, new, cast(cache), jnp.asarray(first), jnp.int32(clock))
                    out[implementation] = step(*args, ring=ring, table=table, implementation=implementation)
                np.testing.assert_allclose(
                    np.asarray(out["pallas"][0], np.float32), np.asarray(out["xla"][0], np.float32), **tolerance
                )
                np.testing.assert_array_equal(np.asarray(out["pallas"][1]), np.asarray(out["xla"][1]))


def test_paged_slot_engine_on_the_chip_decodes_through_the_kernel():
    """The slot engine on the chip with its KV paged (EngineConfig.kv_gib) into a pool too small for its
    rows, so that rows are preempted and prefilled again, against the static sampler there: a float32
    model whose rings read through the kernel (head_dim 64: 128-lane rows; rings of 256 and a window of
    128, blocks of 128), 6 ragged prompts x 3 greedy samples of up to 100 tokens on 4 slots, the clock
    past the cache length; "highest" precision and a peaked output layer (argmaxes with wide margins):
    the same tokens, log-probs within 1e-4."""
    from models import random_params, small_model

    from olmax.rollout.decode_attention import tiles
    from olmax.rollout.engine import SlotEngine
    from olmax.rollout.pages import page_bytes
    from olmax.rollout.sampler import Sampling, sample

    cfg = small_model(
        vocab_size=512, d_model=128, n_layers=3, global_every=2, n_heads=4, n_kv_heads=2, head_dim=64,
        mlp_hidden=256, sliding_window=128, compute_dtype="float32",
    )  # fmt: skip
    assert tiles(jnp.float32, 128, 2 * cfg.head_dim)  # the kernel's path on the chip
    params = random_params(cfg, jax.random.key(2))
    params["lm_head"] = params["lm_head"] * 20
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (3, 40, 17, 28, 9, 33)]
    limits = rng.integers(20, 101, len(prompts) * 3)
    costs = page_bytes(cfg, 256)
    gib = (5 * costs[256] + 6 * costs[128]) / 2**30  # 4 pages of 128 positions for 4 slots of 256
    with jax.default_matmul_precision("highest"):
        want = sample(params, cfg, prompts, 100, n=3, sampling=Sampling(), limits=limits)
        engine = SlotEngine(cfg, slots=4, cache_len=256, sampling=Sampling(), chunk_steps=16, kv_gib=gib)
        for i, p in enumerate(prompts):
            engine.add(p, 3, first_index=3 * i, limits=limits[3 * i : 3 * i + 3])
        finished = engine.run(params)
    tokens, logprobs, lengths = (np.asarray(x) for x in (want.tokens, want.logprobs, want.lengths))
    for f in finished:
        np.testing.assert_array_equal(f.tokens, tokens[f.index, : lengths[f.index]])
        np.testing.assert_allclose(f.logprobs, logprobs[f.index, : lengths[f.index]], atol=1e-4, rtol=0)
    assert engine.totals.preempted_rows > 0 and int(engine._state.clock) > 256
