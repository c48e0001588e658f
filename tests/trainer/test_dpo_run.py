"""`olmax train` with trainer.objective=dpo, in process, on preference rows in a JSONL file tokenized
with the Instruct chat template. Fast: the pair loader's batches (both sides, cut and padded, masks,
seeded order, resume, ranks); the parameters' fingerprint (the same on any mesh, another for any
change); a reference cache of other parameters under the same start refused, naming both fingerprints,
and the CLI's exit 2 on it. Slow (one tiny run per module, dolma2's real vocabulary, so the output layer
dominates): the reference pass into its cache beside the pairs, three steps (one epoch: linear schedule
with 10% warmup, as the DPO recipes), the DPO metrics in metrics.jsonl; a second run reuses the cache;
a reference pass stopped half way resumes to the same log-probs, which the uncached pass (how `olmax
demo chat` scores held-out pairs) gives too; a stopped run resumes exactly; SFT redone into the same
directory with as many steps is refused, for a new run and for a resumed one."""

import json
import re
import shutil
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from small_run import SMALL
from typer.testing import CliRunner

from olmax.cli.common import app
from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.data.chat_files import read_documents, tokenize_chat
from olmax.data.pairs import PairLoader, PairSource, pair_order_report
from olmax.errors import ConfigError
from olmax.model.olmo3 import init_params, param_shardings
from olmax.model.sharding import make_mesh
from olmax.step.state import init_train_state
from olmax.trainer.reference import (
    CACHE_DIR,
    COMPLETE,
    KEY_FILE,
    open_pairs,
    pair_logps,
    params_fingerprint,
    reference_logps_cache,
)
from olmax.trainer.run import train

DEVICES = 4  # a pair per device and step: 12 pairs are 3 steps


def _rows():
    """12 pairs; the last one's chosen side is longer than the sequence (cut, as open-instruct does)."""
    rows = []
    for i in range(12):
        question = f"What is {i} plus {i}?"
        rows.append(
            {
                "chosen": [{"role": "user", "content": question}, {"role": "assistant", "content": f"{2 * i}."}],
                "rejected": [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": f"{i + 1}, I think."},
                ],
            }
        )
    rows[-1]["chosen"][1]["content"] = " ".join(["very"] * 200) + " long."
    return rows


def _overrides(tmp, data, *extra):
    """The run, as overrides of the tiny recipe (what `olmax train --recipe tiny` takes)."""
    return SMALL + [
        f"data.work_dir={tmp / 'cache'}",
        f"data.paths=[{data}]",
        "data.seq_len=64",
        "trainer.objective=dpo",
        "trainer.global_batch=4",
        "trainer.max_steps=null",  # the end of the epoch: 12 pairs / 4 = 3 steps
        "trainer.loss_chunk=16",
        "optimizer.z_loss=0",
        "optimizer.weight_decay=0",
        "optimizer.b2=0.999",
        "optimizer.skip_step=false",
        "optimizer.lr=1e-3",
        "schedule.name=linear",
        "schedule.warmup_steps=0",
        "schedule.warmup_fraction=0.1",
        "schedule.alpha_f=0",
        "schedule.t_max_epochs=1",
        "eval.every=0",
        *extra,
    ]


def _config(tmp, data, *extra):
    return apply_overrides(get_recipe("tiny"), _overrides(tmp, data, *extra))


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """The rows tokenized into tmp/pairs/{chosen,rejected}/ (no --max-seq-len: the loader cuts)."""
    tmp = tmp_path_factory.mktemp("dpo_run")
    src = tmp / "pairs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    tokenize_chat([src], tmp / "pairs", "instruct")
    return tmp, _config(tmp, tmp / "pairs")


@pytest.fixture(scope="module")
def run(pairs):
    tmp, cfg = pairs
    rows = train(cfg, tmp / "run", devices=jax.devices()[:DEVICES], progress=False)
    return tmp, cfg, rows


def test_pair_batches(pairs):
    """Both sides of every pair in one batch row, cut and padded to data.seq_len, the label masks as
    response masks; every pair once an epoch in the seeded order; resumable; ranks split the pairs."""
    tmp, cfg = pairs
    source = PairSource(cfg.data)
    assert len(source) == 12 and source.dropped == 0
    chosen, _ = (read_documents(tmp / "pairs" / side, np.uint32) for side in ("chosen", "rejected"))
    reference = np.arange(24, dtype=np.float32).reshape(12, 2)
    loader = PairLoader(cfg.data, source, reference, 4)
    batches = [b for _, b in zip(range(4), loader)]
    epoch = np.concatenate([b["index"] for b in batches[:3]])
    assert sorted(epoch) == list(range(12)) and list(epoch) != list(range(12))  # shuffled, each once
    assert loader.epoch == 2 and set(batches[3]["index"]) <= set(range(12))
    for b in batches:
        assert b["input_ids"].shape == b["response_mask"].shape == (4, 2, 64) and b["input_ids"].dtype == np.int32
        np.testing.assert_array_equal(b["reference_logps"], reference[b["index"]])
        for row, i in enumerate(b["index"]):
            ids, mask = chosen[i]
            n = min(len(ids), 64)  # pair 11's chosen side is longer: its first 64 tokens
            np.testing.assert_array_equal(b["input_ids"][row, 0, :n], ids[:n])
            np.testing.assert_array_equal(b["response_mask"][row, 0, :n], mask[:n])
            assert (b["input_ids"][row, 0, n:] == cfg.data.pad_token_id).all() and not b["response_mask"][
                row, 0, n:
            ].any()
    assert len(chosen[11][0]) > 64
    # the same order again; from a saved state, the next batch; two ranks split each batch
    again = PairLoader(cfg.data, source, reference, 4)
    first = next(iter(again))
    np.testing.assert_array_equal(first["index"], batches[0]["index"])
    resumed = PairLoader(cfg.data, source, reference, 4, state=again.state())
    np.testing.assert_array_equal(next(iter(resumed))["index"], batches[1]["index"])
    ranks = [next(iter(PairLoader(cfg.data, source, reference, 4, dp_rank=r, dp_size=2)))["index"] for r in (0, 1)]
    assert sorted(np.concatenate(ranks)) == sorted(batches[0]["index"])
    other_seed = PairSource(replace(cfg.data, seed=1))
    assert list(next(iter(PairLoader(replace(cfg.data, seed=1), other_seed, reference, 4)))["index"]) != list(
        batches[0]["index"]
    )


def test_data_order_reports_the_pairs_the_loader_delivers(pairs):
    """`olmax data order` on DPO data: each rank's pair ids at each step are the loader's batch
    `index`, and with tokens each side is the row the loader trains on, without the padding."""
    tmp, cfg = pairs
    source = PairSource(cfg.data)
    reference = np.zeros((12, 2), np.float32)
    report = pair_order_report(cfg.data, 4, range(1, 4), dp_size=2, with_tokens=True)
    assert (report["kind"], report["instances"], report["batches_per_epoch"]) == ("pairs", 12, 3)
    assert report["global_batch"] == 4  # the token order report's word for it
    assert report["fingerprint"] == source.fingerprint
    for r in (0, 1):
        loader = PairLoader(cfg.data, source, reference, 4, dp_rank=r, dp_size=2)
        for step, batch in zip(report["steps"], loader):
            row = step["ranks"][r]
            assert row["rank"] == r and row["ids"] == batch["index"].tolist()
            assert row["documents"] == source.pairs[batch["index"]].tolist()
            for k, inst in enumerate(row["instances"]):
                for side, name in enumerate(("chosen", "rejected")):
                    n = len(inst[name]["tokens"])
                    assert n <= 64 and (batch["input_ids"][k, side, n:] == cfg.data.pad_token_id).all()
                    assert inst[name]["tokens"] == batch["input_ids"][k, side, :n].tolist()
                    assert inst[name]["label_mask"] == batch["response_mask"][k, side, :n].tolist()
                    assert {type(v) for v in inst[name]["label_mask"]} == {bool}  # true/false, as for SFT instances
    out = CliRunner().invoke(
        app, ["data", "order", "--recipe", "tiny", *_overrides(tmp, tmp / "pairs"), "--steps", "3:4"]
    )
    assert out.exit_code == 0, out.output
    ids = report["steps"][2]["ranks"][0]["ids"]
    assert "pairs 12  batches/epoch 3" in out.output and f"step 3 (batch 2) rank 0: {ids[0]}@doc" in out.output
    out = CliRunner().invoke(
        app, ["data", "order", "--recipe", "tiny", *_overrides(tmp, tmp / "pairs"), "--steps", "4:5"]
    )
    assert out.exit_code == 2 and "past the last step 3" in out.output


def _params(cfg, seed, devices=1):
    """Parameters of the model's shapes, drawn on the host (no init program to compile), placed in their
    training layout on the first `devices` devices."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda key: init_params(cfg.model, key), jax.random.key(0))
    host = jax.tree.map(lambda s: rng.standard_normal(s.shape, np.float32), shapes)
    return jax.device_put(host, param_shardings(cfg.model, make_mesh(cfg.mesh, jax.devices()[:devices])))


@pytest.fixture(scope="module")
def start_fingerprint(pairs):
    """The fingerprint of _params(cfg, 0) on one device, which the cache tests record as the start's: the
    same for every config of the pairs' model shapes (what the forward reads beside them is not hashed)."""
    return params_fingerprint(_params(pairs[1], 0))


def test_params_fingerprint_is_the_parameters_content(pairs):
    """The same values give the same fingerprint on any mesh (sharded over 8 devices, or on 1); one
    element one bit off, two rows swapped, a dtype or another architecture's parameters do not."""
    cfg = apply_overrides(pairs[1], ["model.vocab_size=1000"])  # small leaves: the test is compiling
    fingerprint = params_fingerprint(_params(cfg, 0, devices=8))
    one = _params(cfg, 0)
    assert params_fingerprint(one) == fingerprint
    emb = np.asarray(one["embed"])
    one_bit = emb.copy()
    one_bit.view(np.uint32)[7, 3] ^= 1  # the lowest mantissa bit of one element
    swapped = emb.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    for changed in (one_bit, swapped, emb.astype(jnp.bfloat16)):
        assert params_fingerprint({**one, "embed": jax.device_put(changed, one["embed"].sharding)}) != fingerprint
    assert params_fingerprint(_params(apply_overrides(cfg, ["model.n_layers=1"]), 0)) != fingerprint


def test_a_cache_of_other_parameters_under_the_same_name_is_refused(pairs, tmp_path, start_fingerprint):
    """SFT redone into the same directory with as many steps: the cache's start reads the same (path
    and step), its parameters' fingerprint does not, so the cache is refused, naming it and both
    fingerprints; the parameters it was computed from read it without a reference pass."""
    tmp, cfg = pairs
    shutil.copytree(tmp / "pairs", tmp_path / "pairs", ignore=shutil.ignore_patterns(CACHE_DIR))
    cfg = _config(tmp_path, tmp_path / "pairs", f"checkpoint.init_from={tmp_path / 'sft'}")
    source = PairSource(cfg.data)
    cache = tmp_path / "pairs" / CACHE_DIR
    cache.mkdir()
    logps = np.arange(24, dtype=np.float32).reshape(12, 2)
    np.save(cache / COMPLETE, logps)  # as a complete pass from the first SFT leaves it
    first, again = start_fingerprint, params_fingerprint(_params(cfg, 1))
    mesh = make_mesh(cfg.mesh, jax.devices()[:DEVICES])

    def no_pass():
        raise AssertionError("the cache is complete: no reference pass")

    np.testing.assert_array_equal(reference_logps_cache(cfg, mesh, source, no_pass, first, log=print), logps)
    key = json.loads((cache / KEY_FILE).read_text())
    assert key["parameters"] == first and key["data"] == source.fingerprint
    with pytest.raises(ConfigError) as refused:
        reference_logps_cache(cfg, mesh, source, no_pass, again, log=print)
    assert str(cache) in str(refused.value) and first in str(refused.value) and again in str(refused.value)


def test_a_cache_with_another_key_exits_2(pairs, tmp_path):
    """The CLI refuses a reference cache computed from other starting parameters, naming both."""
    tmp, cfg = pairs
    shutil.copytree(tmp / "pairs", tmp_path / "pairs", ignore=shutil.ignore_patterns(CACHE_DIR))
    source = PairSource(replace(cfg.data, paths=(str(tmp_path / "pairs"),)))
    (tmp_path / "pairs" / CACHE_DIR).mkdir()
    other = params_fingerprint(_params(cfg, 1))  # not the random init of trainer.seed=0 the run starts from
    (tmp_path / "pairs" / CACHE_DIR / KEY_FILE).write_text(
        json.dumps({"parameters": other, "data": source.fingerprint, "start": "random init, trainer.seed=1"})
    )
    # all 8 devices (the CLI takes no device list): 8 pairs a step
    args = _overrides(tmp_path, tmp_path / "pairs", "trainer.global_batch=8")
    out = CliRunner().invoke(app, ["train", "--recipe", "tiny", "--run-dir", str(tmp_path / "run"), *args])
    assert out.exit_code == 2, out.output
    output = " ".join(out.output.split())  # the message, unwrapped
    fingerprints = re.findall(r'"parameters": "([0-9a-f]{64})"', output)
    assert len(fingerprints) == 2 and fingerprints[0] == other != fingerprints[1]
    assert "random init, trainer.seed=1" in output and "random init, trainer.seed=0" in output


@pytest.mark.parametrize(
    "change, field, was, now",
    [
        ("model.compute_dtype=bfloat16", "model.compute_dtype", "float32", "bfloat16"),
        ("model.sliding_window=8", "model.sliding_window", "4", "8"),
        ("model.rope_theta=20000", "model.rope_theta", "10000", "20000"),
        ("trainer.loss_chunk=32", "trainer.loss_chunk", "16", "32"),
        ("model.attention=splash", "model.attention", "xla", "splash"),
    ],
)
def test_a_cache_of_another_forward_is_refused(pairs, tmp_path, start_fingerprint, change, field, was, now):
    """The reference log-probs depend on how the forward computes them as well as on the parameters and
    the pairs: a cache computed under one setting of a field the forward reads is refused by a run over
    the same pairs and start under another, naming the field and both values, before any parameters
    load (open_pairs) and by the cache itself; the same settings read it again."""
    tmp, cfg = pairs
    shutil.copytree(tmp / "pairs", tmp_path / "pairs", ignore=shutil.ignore_patterns(CACHE_DIR))
    first = _config(tmp_path, tmp_path / "pairs", "model.sliding_window=4", "model.rope_theta=10000")
    source = PairSource(first.data)
    cache = tmp_path / "pairs" / CACHE_DIR
    cache.mkdir()
    logps = np.arange(24, dtype=np.float32).reshape(12, 2)
    np.save(cache / COMPLETE, logps)  # as a complete pass under `first` leaves it
    fingerprint = start_fingerprint
    mesh = make_mesh(first.mesh, jax.devices()[:DEVICES])

    def no_pass():
        raise AssertionError("the cache is complete: no reference pass")

    np.testing.assert_array_equal(reference_logps_cache(first, mesh, source, no_pass, fingerprint, log=print), logps)
    other = apply_overrides(first, [change])
    for refuse in (
        lambda: open_pairs(other, mesh),
        lambda: reference_logps_cache(other, mesh, source, no_pass, fingerprint, log=print),
    ):
        with pytest.raises(ConfigError) as refused:
            refuse()
        message = " ".join(str(refused.value).split())
        assert str(cache) in message and f"{field}={was}" in message and f"{field}={now}" in message, message
    assert open_pairs(first, mesh) is not None
    np.testing.assert_array_equal(reference_logps_cache(first, mesh, source, no_pass, fingerprint, log=print), logps)


def test_a_cache_that_does_not_say_how_it_was_computed_is_refused(pairs, tmp_path, start_fingerprint):
    """A cache whose key records the parameters and the pairs but not the forward (olmax before the
    forward was keyed) may hold log-probs of another precision or window: refused, saying why, once the
    parameters match (a cache of other parameters is refused first, naming both fingerprints)."""
    tmp, cfg = pairs
    shutil.copytree(tmp / "pairs", tmp_path / "pairs", ignore=shutil.ignore_patterns(CACHE_DIR))
    cfg = _config(tmp_path, tmp_path / "pairs")
    source = PairSource(cfg.data)
    fingerprint = start_fingerprint
    cache = tmp_path / "pairs" / CACHE_DIR
    cache.mkdir()
    np.save(cache / COMPLETE, np.zeros((12, 2), np.float32))
    (cache / KEY_FILE).write_text(json.dumps({"parameters": fingerprint, "data": source.fingerprint, "start": "?"}))
    mesh = make_mesh(cfg.mesh, jax.devices()[:DEVICES])
    assert open_pairs(cfg, mesh) is not None  # nothing to compare before the parameters load
    with pytest.raises(ConfigError, match="computed before olmax recorded how the forward computes them"):
        reference_logps_cache(cfg, mesh, source, lambda: None, fingerprint, log=print)


@pytest.mark.slow
def test_sft_redone_into_the_same_directory_does_not_reuse_the_cache(pairs, tmp_path):
    """A DPO run from SFT_DIR (last step 3) fills the cache; SFT is redone into SFT_DIR with as many
    steps (other parameters under the same path and step). A new DPO run from it is refused rather than
    trained on the old log-probs; so is the first run resumed, once its cache is gone, as its start is
    no longer the one its checkpoint recorded."""
    from olmax.checkpoint.store import save_params

    tmp, _ = pairs
    shutil.copytree(tmp / "pairs", tmp_path / "pairs", ignore=shutil.ignore_patterns(CACHE_DIR))
    sft = tmp_path / "sft"
    cfg = _config(tmp_path, tmp_path / "pairs", f"checkpoint.init_from={sft}")
    devices = jax.devices()[:DEVICES]
    save_params(sft, _params(cfg, 0, DEVICES), cfg.model, {}, step=3)
    train(cfg, tmp_path / "first", devices=devices, stop_at=1, progress=False)
    assert (tmp_path / "pairs" / CACHE_DIR / COMPLETE).is_file()
    shutil.rmtree(sft)
    save_params(sft, _params(cfg, 1, DEVICES), cfg.model, {}, step=3)
    with pytest.raises(ConfigError, match="computed for"):
        train(cfg, tmp_path / "second", devices=devices, stop_at=1, progress=False)
    shutil.rmtree(tmp_path / "pairs" / CACHE_DIR)
    with pytest.raises(ConfigError, match="holds other parameters now"):
        train(cfg, tmp_path / "first", devices=devices, stop_at=2, progress=False)


@pytest.mark.slow
def test_trains_on_pairs_and_logs_dpo_metrics(run):
    tmp, cfg, rows = run
    assert [r["step"] for r in rows] == [1, 2, 3]
    logged = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logged == rows
    for r in rows:
        for key in ("train/DPO loss", "train/rewards/chosen", "train/rewards/rejected", "train/rewards/margins"):
            assert np.isfinite(r[key]), key
        assert r["train/rewards/margins"] == pytest.approx(r["train/rewards/chosen"] - r["train/rewards/rejected"])
        assert r["train/rewards/accuracy"] in (0.0, 0.25, 0.5, 0.75, 1.0)
        assert r["throughput/total tokens"] == r["step"] * 2 * 4 * 64 and r["data/instances"] == r["step"] * 4
    # step 1 starts at the reference: every ratio 0, loss log 2, rewards 0
    assert rows[0]["train/DPO loss"] == pytest.approx(np.log(2), abs=1e-5)
    assert rows[0]["train/rewards/chosen"] == pytest.approx(0, abs=1e-4)
    assert rows[1]["train/DPO loss"] < np.log(2)  # the first update already separates the pairs it saw
    # 10% warmup of 3 steps rounds to 0; OLMo-core's numbering: step s takes lr (1 - s / 3) (HF's
    # LambdaLR, open-instruct's, gives step s the factor of s - 1: docs/post-training/dpo.md)
    assert [r["optim/LR"] for r in rows] == pytest.approx([1e-3 * 2 / 3, 1e-3 / 3, 0.0])


@pytest.mark.slow
def test_reference_cache_is_keyed_and_reused(run):
    tmp, cfg, rows = run
    cache = tmp / "pairs" / CACHE_DIR
    key = json.loads((cache / KEY_FILE).read_text())
    assert key["start"] == "random init, trainer.seed=0" and key["data"] == PairSource(cfg.data).fingerprint
    mesh = make_mesh(cfg.mesh, jax.devices()[:DEVICES])
    with jax.set_mesh(mesh):
        assert key["parameters"] == params_fingerprint(init_train_state(cfg, mesh, jax.random.key(0)).params)
    assert PairSource(cfg.data).dropped == 0 and len(np.load(cache / COMPLETE)) == 12
    stamps = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    again = train(cfg, tmp / "again", devices=jax.devices()[:DEVICES], stop_at=1, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps  # read, not written
    assert again[0]["train/DPO loss"] == rows[0]["train/DPO loss"]


@pytest.mark.slow
def test_a_stopped_reference_pass_resumes_to_the_same_log_probs(run):
    tmp, cfg, _ = run
    shutil.copytree(tmp / "pairs", tmp / "stopped", ignore=shutil.ignore_patterns(CACHE_DIR))
    shutil.copytree(tmp / "pairs" / CACHE_DIR, tmp / "stopped" / CACHE_DIR)
    cache = tmp / "stopped" / CACHE_DIR
    # as a pass killed after its first forward: the complete file and the later chunks are not there
    (cache / COMPLETE).unlink()
    chunks = sorted(cache.glob("chunk_*.npy"))
    assert [c.name for c in chunks] == [f"chunk_{s:09d}_{s + 4:09d}.npy" for s in (0, 4, 8)]
    for c in chunks[1:]:
        c.unlink()
    cfg = _config(tmp, tmp / "stopped")
    source = PairSource(cfg.data)
    mesh = make_mesh(cfg.mesh, jax.devices()[:DEVICES])
    said = []
    with jax.set_mesh(mesh):
        start = init_train_state(cfg, mesh, jax.random.key(0)).params
        logps = reference_logps_cache(cfg, mesh, source, lambda: start, params_fingerprint(start), log=said.append)
        uncached = pair_logps(cfg, mesh, source, start)  # how the chat demo scores its held-out pairs
    assert said == [f"DPO reference pass: resuming at pair 4 of 12 ({cache})", "DPO reference pass: 8 of 12 pairs"]
    np.testing.assert_array_equal(logps, np.load(tmp / "pairs" / CACHE_DIR / COMPLETE))
    np.testing.assert_array_equal(uncached, logps)


@pytest.mark.slow
def test_resume_continues_exactly(run):
    """Stopped after step 1 (checkpoint, loader state) and resumed: steps 2 and 3 as the straight run's."""
    tmp, cfg, rows = run
    first = train(cfg, tmp / "resumed", devices=jax.devices()[:DEVICES], stop_at=1, progress=False)
    rest = train(cfg, tmp / "resumed", devices=jax.devices()[:DEVICES], progress=False)
    keys = ("train/DPO loss", "train/rewards/margins", "train/rewards/accuracy", "optim/total grad norm", "optim/LR")
    assert [{k: r[k] for k in keys} for r in first + rest] == [{k: r[k] for k in keys} for r in rows]


def test_the_pairs_fingerprint_covers_their_label_masks(pairs, tmp_path):
    """The reference pass sums over the label masks, so the pairs' fingerprint (which keys the reference
    cache and a resume's data check) changes with a mask, the tokens the same: as written by `olmax
    tokenize --chat` (the manifest's label_mask_sha256) and, for output written before it recorded them,
    hashed from the mask files."""
    import hashlib

    from olmax.data.tokenize import MANIFEST

    src, cfg = pairs
    before = PairSource(cfg.data).fingerprint
    copy = tmp_path / "pairs"
    shutil.copytree(src / "pairs", copy, ignore=shutil.ignore_patterns("reference_logps"))
    moved = replace(cfg.data, paths=(str(copy),))
    assert PairSource(moved).fingerprint == before  # the same pairs elsewhere
    manifest = json.loads((copy / "chosen" / MANIFEST).read_text())
    shard = manifest["shards"][0]
    mask = bytearray((copy / "chosen" / shard["label_mask"]).read_bytes())
    mask[-1] ^= 1  # the last token of the chosen side: trained on, or not
    (copy / "chosen" / shard["label_mask"]).write_bytes(bytes(mask))
    shard["label_mask_sha256"] = hashlib.sha256(bytes(mask)).hexdigest()  # as a new tokenization records it
    (copy / "chosen" / MANIFEST).write_text(json.dumps(manifest))
    recorded = PairSource(moved).fingerprint
    assert recorded != before
    del shard["label_mask_sha256"]  # output from before the digest was recorded: the file is hashed
    (copy / "chosen" / MANIFEST).write_text(json.dumps(manifest))
    assert PairSource(moved).fingerprint == recorded
