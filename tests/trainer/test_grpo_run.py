"""`olmax train` with trainer.objective=grpo: the rollout loader (olmax.rollout.producer) and the loop.

Fast: the prompt order is a per-epoch permutation that a saved state resumes, and prompts a rollout
solved often enough leave it at the next epoch. Slow (a small random model; the rewards come from a
test verifier, an entry point that scores a response by a hash of its text, so groups have a spread):
three steps log the rollout and GRPO figures with the sampler's log-probs equal to the trainer's; a run
stopped after step 2 and resumed replays the same rollouts and losses and ends on the same parameters.
"""

import json
from collections import Counter

import jax
import numpy as np
import pytest
from small_run import SMALL

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.data.chat_corpus import read_rows
from olmax.data.tokenizer import load_tokenizer
from olmax.errors import ConfigError
from olmax.model.sharding import make_mesh
from olmax.rewards import verifiers as rewards
from olmax.rollout.producer import RolloutProducer, prompt_set
from olmax.rollout.stream import Group

VERIFIER = '''
import hashlib
from collections import Counter


def coin(response, ground_truth, **_):
    """1 for about half the texts: a reward with a spread, from a random model's random text."""
    return float(hashlib.sha256(response.encode()).digest()[0] % 2)
'''


def _prompts(tmp):
    """The demo's RL prompts, their verifier renamed to the test's (`coin`)."""
    path = tmp / "coin.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps({**r, "dataset": "coin"}) + "\n" for r in read_rows("rl")[:64]))
    return path


def _config(tmp, *extra):
    return apply_overrides(get_recipe("tiny_grpo"), _config_overrides(tmp, *extra))


def _config_overrides(tmp, *extra):
    return SMALL + [
        f"data.work_dir={tmp / 'cache'}",
        f"data.paths=[{_prompts(tmp)}]",
        "data.seq_len=96",
        "grpo.max_prompt_len=64",
        "grpo.max_response_len=16",
        "grpo.prompts_per_step=4",
        "grpo.samples_per_prompt=4",
        "trainer.global_batch=16",
        "trainer.max_steps=3",
        "schedule.warmup_steps=0",
        "checkpoint.every=100",
        "optimizer.lr=1e-3",
        *extra,
    ]


def test_prompt_order_resumes_and_leaves_solved_prompts_out(tmp_path, coin_verifier):
    cfg = _config(tmp_path, "grpo.prompts_per_step=10", "grpo.no_resampling_pass_rate=0.875")
    tok = load_tokenizer("dolma2")
    prompts = prompt_set(cfg, tok)
    mesh = make_mesh(cfg.mesh, jax.devices()[:1])
    loader = RolloutProducer(cfg, mesh, prompts, tok)
    first = [loader._take()[1] for _ in range(3)]
    loader.excluded = [int(i) for i in first[0][:5]]  # marked during the epoch: it keeps its order
    again = RolloutProducer(cfg, mesh, prompts, tok, state=json.loads(json.dumps(loader.state())))
    assert np.array_equal(again.order, loader.order) and np.array_equal(again._take()[1], loader._take()[1])
    seen = np.concatenate(first + [loader._take()[1] for _ in range(len(loader.order) // 10 - 4)])
    assert len(set(seen.tolist())) == len(seen)  # a permutation: no prompt twice in an epoch
    loader.excluded = [int(i) for i in seen[:25]]  # as select_groups' no_resample marks them
    calls = loader.calls
    call, nxt = loader._take()
    assert (
        call == calls and loader.calls == calls + 1 and loader.epoch == 2
    )  # numbered across epochs and not set(nxt.tolist()) & set(loader.excluded)
    assert len(loader.order) == (len(prompts.prompts) - 25) // 10 * 10


def test_a_retry_keeps_the_no_resample_marks_of_the_reads_it_replaces(tmp_path, coin_verifier):
    """Without active sampling a read whose groups all drop (here: every prompt solved) is replaced by
    the next one, but its prompts were solved all the same: open-instruct marks every group it reads
    (`accumulate_inference_batches`), so they leave the order at the next epoch with the later read's."""
    cfg = _config(tmp_path, "grpo.no_resampling_pass_rate=0.875")
    tok = load_tokenizer("dolma2")
    loader = RolloutProducer(cfg, make_mesh(cfg.mesh, jax.devices()[:1]), prompt_set(cfg, tok), tok)
    scale, reads = cfg.grpo.reward_scale, []
    rewards_of_read = [
        [scale] * 16,  # all four solved: no spread, nothing kept, a retry
        [scale] * 4 + [0.0, scale] * 6,  # the first solved (marked, dropped), the others kept
    ]

    class Scripted:
        """The stream, each call's groups scored as `rewards_of_read` says."""

        timing = Counter()

        def next_group(self, params, version):
            if not self.groups:
                _, ids = loader._take()
                reads.append([int(i) for i in ids])
                rw = np.asarray(rewards_of_read[len(reads) - 1], np.float32).reshape(4, 4)
                self.groups = [
                    Group(int(i), [[1, 2]] * 4, [[0.0, 0.0]] * 4, [[0, 0]] * 4, 0, r, []) for i, r in zip(ids, rw)
                ]
            return self.groups.pop(0)

        def end_step(self):
            return len(self.groups)

    loader.stream = Scripted()
    loader.stream.groups = []
    rollout = loader._rollout(None, 0)
    assert rollout.figures["rollout/retries"] == 1 and rollout.figures["rollout/groups_kept"] == 3
    assert loader.excluded == reads[0] + reads[1][:1]


@pytest.mark.parametrize("async_steps, want", [(0, [0.0, 0.0, 0.0]), (1, [0.0, 1.0, 1.0])])
def test_staleness_counts_the_rollouts_between_drawing_and_training(tmp_path, coin_verifier, async_steps, want):
    """rollout/staleness_*: the parameters' version a token was drawn under against the one its rollout
    trains from. Static rollouts sampled one ahead (grpo.async_steps=1) draw rollout r+1 with the
    parameters rollout r trains from (the first two with the initial ones): staleness 1 from the second."""
    import jax.numpy as jnp

    cfg = _config(tmp_path, "grpo.rollout_engine=static", f"grpo.async_steps={async_steps}")
    tok = load_tokenizer("dolma2")
    loader = RolloutProducer(cfg, make_mesh(cfg.mesh, jax.devices()[:1]), prompt_set(cfg, tok), tok)

    class Tagging:
        """The stream, each group's tokens tagged with the version it is read with, rewards with a spread."""

        timing = Counter()

        def next_group(self, params, version):
            _, ids = loader._take() if not hasattr(self, "ids") or not self.ids else (None, self.ids)
            self.ids = list(ids[1:])
            return Group(
                int(ids[0]),
                [[1, 2]] * 4,
                [[0.0, 0.0]] * 4,
                [[version] * 2] * 4,
                0,
                np.asarray([0.0, 10.0] * 2, np.float32),
                [],
            )

        def end_step(self):
            return 0

    loader.stream = Tagging()
    loader.params = {"w": jnp.zeros(2)}
    batches = iter(loader)
    stale = []
    for _ in range(3):
        next(batches)
        stale.append((loader.metrics()["rollout/staleness_mean"], loader.metrics()["rollout/staleness_max"]))
    assert stale == [(w, w) for w in want]
    loader.close()


def test_the_loop_refuses_what_it_cannot_sample_for(tmp_path, coin_verifier):
    tok = load_tokenizer("dolma2")
    mesh = make_mesh(get_recipe("tiny_grpo").mesh, jax.devices()[:1])
    for extra, message in [
        (["data.doc_masking=false", "model.rope_positions=absolute"], "data.doc_masking=true"),
        (["model.rope_positions=absolute"], "model.rope_positions=document"),
        (["grpo.prompts_per_step=65"], "at least grpo.prompts_per_step=65 prompts"),
    ]:
        cfg = _config(tmp_path, *extra)
        with pytest.raises(ConfigError, match=message):
            RolloutProducer(cfg, mesh, prompt_set(cfg, tok), tok)


def test_a_checkpoint_between_mini_batches_keeps_the_rollout_it_is_in(tmp_path, coin_verifier):
    """The rollout's parts not yet trained on (and, sampled ahead, the next rollout's) are saved as the
    checkpoint's data_arrays item and served after the resume, old log-probs included."""
    from olmax.checkpoint.store import RunCheckpoints
    from olmax.rollout.producer import _done, _Rollout
    from olmax.step.state import abstract_state, init_train_state

    # the model never runs here: a 1,024-token output layer keeps the saved and restored state small
    cfg = _config(tmp_path, "grpo.mini_batches=2", "trainer.global_batch=8", "model.vocab_size=1024")
    tok = load_tokenizer("dolma2")
    mesh = make_mesh(cfg.mesh, jax.devices()[:1])
    rng = np.random.default_rng(0)

    def part():
        return {
            "input_ids": rng.integers(0, 100, (8, 96)).astype(np.int32),
            "response_mask": rng.random((8, 96)) < 0.5,
            "old_logps": rng.normal(size=(8, 96)).astype(np.float32),
        }

    loader = RolloutProducer(cfg, mesh, prompt_set(cfg, tok), tok)
    first, nxt = _Rollout([part(), part()], {"rollout/reward_mean": 2.5}), _Rollout([part(), part()], {})
    loader._queue.extend([_done(first), _done(nxt)])
    batches = iter(loader)
    next(batches)  # the first mini-batch trained on; the checkpoint follows
    ckpts = RunCheckpoints(tmp_path / "checkpoints", cfg)
    ckpts.save(1, init_train_state(cfg, mesh, jax.random.key(0)), loader.state(), mesh)
    ckpts.close()
    _, data_state = RunCheckpoints(tmp_path / "checkpoints", cfg).restore_latest(abstract_state(cfg, mesh))
    again = iter(RolloutProducer(cfg, mesh, prompt_set(cfg, tok), tok, state=data_state))
    for want in (first.parts[1], *nxt.parts):
        got = next(again)
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)


@pytest.fixture
def coin_verifier(tmp_path, monkeypatch):
    (tmp_path / "olmax_coin.py").write_text(VERIFIER)
    dist = tmp_path / "olmax_coin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: olmax-coin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[olmax.verifiers]\ncoin = olmax_coin:coin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards.shutdown()  # the next worker is spawned with this sys.path
    yield
    rewards.shutdown()


@pytest.fixture
def zero_verifier(tmp_path, monkeypatch):
    """A verifier plugin (an `olmax.verifiers` entry point) that fails every response."""
    (tmp_path / "olmax_zero.py").write_text("def zero(response, ground_truth, **_):\n    return 0.0\n")
    dist = tmp_path / "olmax_zero-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: olmax-zero\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[olmax.verifiers]\nzero = olmax_zero:zero\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards.shutdown()
    path = tmp_path / "zero.jsonl"
    path.write_text("".join(json.dumps({**r, "dataset": "zero"}) + "\n" for r in read_rows("rl")[:64]))
    yield path
    rewards.shutdown()


@pytest.mark.parametrize(
    "engine",
    [
        "grpo.max_staleness=1",  # the default engine; the others are in the slow set (a run each)
        pytest.param("grpo.max_staleness=0", marks=pytest.mark.slow),
        pytest.param("grpo.rollout_engine=static", marks=pytest.mark.slow),
        pytest.param("grpo.rollout_engine=static grpo.async_steps=1", marks=pytest.mark.slow),
        pytest.param("grpo.max_staleness=1 grpo.active_sampling=true", marks=pytest.mark.slow),
    ],
)
def test_a_read_with_no_signal_retries_then_applies_an_empty_batch(tmp_path, zero_verifier, engine):
    """Every response fails (a broken verifier, a weak model's first steps): no group has a reward spread,
    so each step reads its prompts again EMPTY_RETRIES times, then gets an empty batch, which the train
    step does not apply (the step counts and logs it, nothing moves); on every engine and staleness."""
    from olmax.rollout.producer import EMPTY_RETRIES
    from olmax.trainer.run import train

    # two prompts of 4 samples a read: the retries' count is what is proved, not the batch's size
    small = ["grpo.max_response_len=4", "grpo.prompts_per_step=2", "trainer.global_batch=8"]
    cfg = _config(tmp_path, *engine.split(), f"data.paths=[{zero_verifier}]", *small)
    rows = train(apply_overrides(cfg, ["trainer.max_steps=1"]), tmp_path / "run", progress=False)
    assert [r["step"] for r in rows] == [1]
    for r in rows:
        assert r["rollout/empty_batch"] == 1 and r["rollout/groups_kept"] == 0, r
        assert r["rollout/retries"] == EMPTY_RETRIES and r["train/response tokens"] == 0
        assert r["rollout/verifier/zero/ok"] == (EMPTY_RETRIES + 1) * 8


# Rows of many lengths: a stop string a random model often spells. A random model's rows all run to the
# length limit otherwise, and a step's rows then stop together and none carries into the next step
# (a read decodes nothing once its groups have stopped: olmax.rollout.stream).
VARIED = "grpo.stop=[q]"
# rows caught mid-response at the checkpoint: 16 slots for three steps' worth of groups, so rows enter
# as others stop
MID_RESPONSE = f"grpo.max_staleness=2 grpo.slots=16 {VARIED} grpo.tis_cap=2.0"


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine",
    [
        "grpo.max_staleness=0",
        pytest.param(f"grpo.max_staleness=1 {VARIED}", id="staleness-1"),
        pytest.param(MID_RESPONSE, id="mid-response"),
        pytest.param(
            f"grpo.max_staleness=1 grpo.read_order=completion grpo.active_sampling=true {VARIED}", id="completion"
        ),
        "grpo.rollout_engine=static",
    ],
)
def test_grpo_run_logs_its_figures_and_resumes_exactly(tmp_path, coin_verifier, engine):
    """Three steps, and the same run stopped after step 2 and resumed: the same step 3 and parameters.
    Synchronous (the static engine, or the continuous one with max_staleness 0) the sampler's log-probs
    are the trainer's; with max_staleness >= 1 rows carry over a step, their earlier tokens' log-probs the
    older parameters', and the resumed run re-prefills them as the straight one does at its checkpoint
    (MID_RESPONSE: rows with tokens are in flight there, their tokens' TIS weights in the loss)."""
    from olmax.checkpoint.store import RunCheckpoints, load_params
    from olmax.step.state import abstract_state
    from olmax.trainer.run import train

    engine = engine.split()
    stale = max([int(e.split("=")[1]) for e in engine if e.startswith("grpo.max_staleness=")], default=0)
    straight = train(_config(tmp_path, *engine, "checkpoint.every=2"), tmp_path / "a", progress=False)
    assert [r["step"] for r in straight] == [1, 2, 3]
    for r in straight:
        assert r["rollout/verifier/coin/ok"] >= 16 and 0 < r["rollout/groups_kept"] <= 4
        assert r["train/response tokens"] > 0 and r["rollout/rows_dropped"] == 0
        assert np.isfinite(r["train/GRPO loss"]) and r["optim/total grad norm"] > 0
        assert 0 < r["rollout/slot_efficiency_run"] <= 1 and r["rollout/staleness_max"] <= stale
    gaps = [r["debug/sampler_logp_diff_mean"] for r in straight]
    assert (max(gaps[1:]) > 1e-4) if stale else (max(gaps) < 1e-5), gaps  # the trainer's, when synchronous
    cfg = _config(tmp_path, *engine, "checkpoint.every=2")
    train(cfg, tmp_path / "b", stop_at=2, progress=False)
    if engine == MID_RESPONSE.split():
        mesh = make_mesh(cfg.mesh, jax.devices()[:1])
        _, data = RunCheckpoints(tmp_path / "b" / "checkpoints", cfg).restore_latest(abstract_state(cfg, mesh))
        assert data["arrays"]["stream"]["engine"]["token_lens"].max() > 0  # rows caught mid-response
    resumed = train(cfg, tmp_path / "b", progress=False)
    assert [r["step"] for r in resumed] == [3]
    keys = [k for k in straight[-1] if k.startswith(("rollout/reward", "train/", "optim/", "policy/"))]
    assert {k: resumed[0][k] for k in keys} == {k: straight[-1][k] for k in keys}
    a, _, _ = load_params(tmp_path / "a" / "checkpoints")
    b, _, _ = load_params(tmp_path / "b" / "checkpoints")
    assert all(jax.tree.leaves(jax.tree.map(lambda x, y: bool((x == y).all()), a, b)))


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine, beta",
    [
        ("grpo.max_staleness=0", 0.0),
        ("grpo.rollout_engine=static grpo.async_steps=1", 0.05),
        pytest.param(f"grpo.max_staleness=1 {VARIED}", 0.0, id="staleness-1"),
    ],
)
def test_a_run_stopped_between_mini_batches_resumes_exactly(tmp_path, coin_verifier, engine, beta):
    """Two mini-batches per rollout, stopped after step 3 (the first of rollout 2) and resumed: the same
    step 4 and parameters as without the stop. Rollout 2 is sampled from the parameters after step 2, or
    with the static engine's grpo.async_steps=1 after step 0 (with rollout 1), or with the continuous
    engine's max_staleness 1 partly before step 2, so step 3's sampler log-probs are then stale.
    With grpo.beta > 0 the KL to the starting parameters is 0 at step 1 and grows; the resumed run
    makes its reference again."""
    from olmax.checkpoint.store import load_params
    from olmax.trainer.run import train

    extra = ["grpo.mini_batches=2", "trainer.global_batch=8", "trainer.max_steps=4"]
    extra += [*engine.split(), f"grpo.beta={beta}"]
    straight = train(_config(tmp_path, *extra), tmp_path / "a", progress=False)
    assert [r["step"] for r in straight] == [1, 2, 3, 4]
    gap = straight[2]["debug/sampler_logp_diff_mean"]
    assert (gap < 1e-5) if "staleness=0" in engine else (gap > 1e-4), gap
    kl = [r["loss/kl_avg"] for r in straight]
    assert (abs(kl[0]) < 1e-6 and kl[3] > 1e-5) if beta else kl == [0.0] * 4, kl
    train(_config(tmp_path, *extra), tmp_path / "b", stop_at=3, progress=False)
    resumed = train(_config(tmp_path, *extra), tmp_path / "b", progress=False)
    assert [r["step"] for r in resumed] == [4]
    keys = [k for k in straight[-1] if k.startswith(("rollout/reward", "train/", "optim/", "policy/", "debug/"))]
    assert {k: resumed[0][k] for k in keys} == {k: straight[-1][k] for k in keys}
    a, _, _ = load_params(tmp_path / "a" / "checkpoints")
    b, _, _ = load_params(tmp_path / "b" / "checkpoints")
    assert all(jax.tree.leaves(jax.tree.map(lambda x, y: bool((x == y).all()), a, b)))


@pytest.mark.slow
def test_two_processes_roll_out_and_train(tmp_path, coin_verifier):
    """Two JAX processes (jax.distributed on 127.0.0.1, 2 CPU devices each, as `olmax launch` starts
    them) run the loop on one 4-device mesh: the sampler's program spans both, each verifies half the
    gathered samples, packs them all with the merged scores and places its devices' rows. The
    trainer's log-probs of the packed rows equal the sampler's at every step, which they would not if a
    process held other rows or misplaced them.
    They stop after step 3, between the two mini-batches of rollout 2; one process resumes their
    checkpoint and trains step 4 on the rollout it kept. (Not compared with one process bit for bit: a
    random model's next-token distribution is nearly flat over 100k tokens, so the last-bit differences
    of another partitioning change a few sampled tokens.)"""
    import os
    import sys

    from launch_env import slurm_tasks

    from olmax.trainer.run import train

    overrides = _config_overrides(tmp_path, "grpo.mini_batches=2", "trainer.global_batch=8", "trainer.max_steps=4")
    worker = [sys.executable, "-m", "olmax.cli.worker", "train", "--recipe", "tiny_grpo", "--stop-at", "3"]
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])  # the test's verifier
    procs = slurm_tasks(
        [*worker, "--run-dir", str(tmp_path / "two"), *overrides], local_devices=2, env={"PYTHONPATH": path}
    )
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    rows = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    cfg = apply_overrides(get_recipe("tiny_grpo"), overrides)
    rows += train(cfg, tmp_path / "two", devices=jax.devices()[:4], progress=False)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        # each process verified half the samples; every score reached both (a lost one counts as "ok" nowhere)
        assert r["rollout/verifier/coin/ok"] == 16 and r["rollout/verified_here"] == 8, r
        assert r["train/response tokens"] > 0
        # old log-probs (the rollout's first step's parameters) against the sampler's
        assert r["debug/sampler_logp_diff_mean"] < 1e-5, r
    assert rows[3]["rollout/reward_mean"] == rows[2]["rollout/reward_mean"]  # the kept rollout, not a new one


def test_the_code_rows_tests_are_counted_by_form_at_load():
    """What the RL loop prints when its prompts have code rows: how their tests will be judged."""
    from olmax.data.prompts import Prompt, PromptSet
    from olmax.rollout.producer import code_test_forms

    tests = ["assert f(1) == 2", "assert not f(0)", "f(3)", "for i in range(3): assert f(i) > 0", "assert 1 + 1 == 2"]
    rows = (Prompt((1,), ("code",), (tests,), "a:1"), Prompt((2,), ("math",), ("2",), "a:2"))
    assert code_test_forms(PromptSet(rows, {}, "instruct")) == (
        "code tests: 4 run against the program from a process of their own, 1 refused at load (do not "
        "parse, or name nothing a program could define: always fail; docs/rewards-code.md)"
    )


def test_the_engines_resident_cache_is_what_it_allocates_and_the_fit_counts_it():
    """olmax.rollout.producer.engine_state_bytes (what the fit of the train step reserves beside it) is
    the state a SlotEngine of the loop's slots allocates; compile-check adds it to the step's peak."""
    from olmax.fit.compile_check import check_fits
    from olmax.fit.compiler import DoesNotFit
    from olmax.rollout.engine import SlotEngine
    from olmax.rollout.producer import engine_slots, engine_state_bytes

    cfg = apply_overrides(get_recipe("tiny_grpo"), SMALL + ["data.seq_len=256", "grpo.sample_prompts=0"])
    mesh = make_mesh(cfg.mesh, jax.devices()[:1])
    rl = cfg.grpo
    engine = SlotEngine(
        cfg.model, mesh, slots=engine_slots(cfg, mesh), cache_len=rl.max_prompt_len + rl.max_response_len
    )
    allocated = sum(x.nbytes for x in jax.tree.leaves(engine._state))
    assert engine_state_bytes(cfg, mesh) == allocated > 0
    assert engine_state_bytes(apply_overrides(cfg, ["grpo.rollout_engine=static"]), mesh) == 0
    report = {
        "recipe": "olmo3_7b_think_rl",
        "topology": "v5p:2x2x1",
        "devices": 4,
        "platform": "tpu",
        "per_device": {"peak_gib": 80.0},
        "resident_gib": 12.5,
        "hbm_limit_gib": 95.74,
        "hbm_headroom": 0.95,
        "chip": "v5p",
        "micro_batch": 1,
        "remat": "full",
        "fits": False,
    }
    with pytest.raises(DoesNotFit, match=r"peak 80.0 GiB \+ 12.5 GiB resident \(the RL engine's cache: grpo.slots\)"):
        check_fits(report)
