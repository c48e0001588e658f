"""`olmax demo chat`: the post-training line on the tiny model, end to end on CPU.

    base  the tiny demo run (`olmax demo`) on the shipped text corpus     RUN_DIR/base
    sft   SFT on the shipped chat corpus's conversations (recipe tiny_sft) RUN_DIR/sft
    dpo   DPO on its preference pairs, from the SFT checkpoint (tiny_dpo)  RUN_DIR/dpo
    rl    GRPO on its prompts, rewarded by the math verifier (tiny_grpo)   RUN_DIR/rl

The chat corpus (olmax.data.chat_corpus) is arithmetic with checkable answers, tokenized with OLMo 3's
Instruct template into RUN_DIR/data/. After each stage the checkpoint answers the held-out prompts
(trained sums in wordings never trained with them) greedily through `olmax generate --chat instruct`'s
path, and an answer counts as solved when the math verifier RL uses (olmax.rewards.math: the last
`\\boxed{}`, compared by sympy) scores it 1; each stage's `held_out_exact` is the solved fraction at
its start and at its end. Only the answers to "What is ...?" questions and a few others are boxed in
the demonstrations (the corpus's module doc), so SFT teaches sums the verifier mostly cannot read, and
the RL stage, rewarded by that verifier, teaches the model to box them all. DPO is scored on held-out
pairs: its `preference_accuracy` (TRL's rewards/accuracies, the SFT checkpoint as the reference). Every
stage is an ordinary `olmax train` run directory, so a rerun resumes an unfinished stage and skips a
finished one. Overrides apply to the sft, dpo and rl stages alike (e.g. trainer.max_steps=10 for a
quick look).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from olmax.checkpoint.inference import load_checkpoint
from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.data.chat_corpus import chat_file, read_rows
from olmax.data.chat_files import tokenize_chat
from olmax.data.pairs import PairSource
from olmax.data.tokenize import MANIFEST
from olmax.demo.pretrain import run_demo
from olmax.model.sharding import make_mesh
from olmax.objectives import dpo
from olmax.objectives.logps import SequenceLogps, scored_tokens
from olmax.rewards import verifiers as rewards
from olmax.rundir.progress import run_end_step
from olmax.trainer.metrics import loss_name, read_metrics
from olmax.trainer.reference import pair_logps
from olmax.trainer.run import train

TEMPLATE = "instruct"
MAX_NEW_TOKENS = 32  # the answers are about 20 tokens: "12 + 4 = 16. The answer is \boxed{16}."


class StageStopped(RuntimeError):
    """A stage's trainer returned before its last step (a SIGTERM saves a checkpoint and returns early):
    the next stage must not start from an unfinished one. A rerun resumes the stage."""


def _tokenized(run_dir: Path) -> dict[str, Path]:
    """The SFT conversations and the preference pairs (trained and held out), tokenized once into
    RUN_DIR/data/."""
    out = {}
    sft_len, dpo_len = get_recipe("tiny_sft").data.seq_len, get_recipe("tiny_dpo").data.seq_len
    for name, seq_len in (("sft", sft_len), ("prefs", dpo_len), ("prefs_heldout", dpo_len)):
        target = run_dir / "data" / name
        done = target / (MANIFEST if name == "sft" else f"rejected/{MANIFEST}")
        if not done.is_file():
            tokenize_chat([chat_file(name)], target, TEMPLATE, max_seq_len=seq_len)
        out[name] = target
    out["rl"] = chat_file("rl")  # the RL stage reads the prompts' rows itself (olmax.data.prompts)
    return out


def _last_number(text: str) -> str | None:
    numbers = re.findall(r"-?\d+", text)
    return numbers[-1] if numbers else None


def held_out_preference_accuracy(pairs: Path, reference: Path, policy: Path) -> float:
    """TRL's rewards/accuracies on the held-out pairs: the fraction whose chosen answer gains more than
    the rejected one, as tiny_dpo's loss measures it (dpo_norm: per response token), from the reference
    checkpoint (SFT) to the policy (DPO). The log-probs come from the reference pass's own forward."""
    cfg = apply_overrides(get_recipe("tiny_dpo"), [f"data.paths=[{pairs}]"])
    mesh = make_mesh(cfg.mesh)
    source = PairSource(cfg.data)
    with jax.set_mesh(mesh):
        ref, pol = (pair_logps(cfg, mesh, source, load_checkpoint(c, mesh)[0]) for c in (reference, policy))
    _, mask = source.rows(np.arange(len(source)))

    def rows(x):  # (pairs, 2, ...) -> chosen rows then rejected rows, as a DPO batch holds them
        return jnp.asarray(np.concatenate([x[:, 0], x[:, 1]]))

    count = scored_tokens(rows(mask)).sum(axis=1, dtype=jnp.float32)
    terms = dpo.pair_terms(SequenceLogps(rows(pol), count), rows(ref), loss_type=cfg.dpo.loss_type, beta=cfg.dpo.beta)
    return float(jnp.mean(terms.chosen_rewards > terms.rejected_rewards))


def held_out_solved(ckpt: Path) -> dict:
    """The checkpoint's greedy answers to the held-out prompts: how many the math verifier credits
    (`solved`: the right number boxed), how many box a number (`formatted`), and how many end on the
    right number in any form (`answered`: the sums the model knows, whether the verifier can read them
    or not)."""
    from olmax.rollout.text import generate_text

    rows = read_rows("rl_heldout")
    report = generate_text(
        str(ckpt), [r["messages"] for r in rows], max_new_tokens=MAX_NEW_TOKENS, chat=TEMPLATE, batch_size=len(rows)
    )
    texts = [r["text"] for r in report["results"]]
    solved = sum(rewards.score("math", t, r["ground_truth"])[0] == 1.0 for t, r in zip(texts, rows))
    return {
        "solved": solved,
        "of": len(rows),
        "formatted": sum("\\boxed{" in t for t in texts),
        "answered": sum(_last_number(t) == r["ground_truth"] for t, r in zip(texts, rows)),
        "examples": [
            {"prompt": r["messages"][0]["content"], "answer": res["text"], "truth": r["ground_truth"]}
            for r, res in list(zip(rows, report["results"]))[:3]
        ],
    }


def _stage(
    recipe: str, run_dir: Path, data: Path, start: Path, overrides: Sequence[str], progress: bool, **shown: str
) -> dict:
    """One post-training stage: `olmax train` of `recipe` on `data` from the checkpoints in `start`, its
    loss curve, and `shown`: {summary key: metric} of its rows (a name ending in _by_step: every step's,
    else the last step's)."""
    cfg = apply_overrides(get_recipe(recipe), [f"data.paths=[{data}]", f"checkpoint.init_from={start}", *overrides])
    train(cfg, run_dir, progress=progress)
    rows = read_metrics(run_dir)
    reached = rows[-1]["step"] if rows else 0
    last = run_end_step(str(run_dir), cfg)
    if reached < last:
        raise StageStopped(
            f"{run_dir.name} stage stopped at step {reached} of {last} (preempted?); "
            f"rerun `olmax demo chat --run-dir {run_dir.parent}` to resume it"
        )
    loss = loss_name(cfg)
    stage = {
        "run_dir": str(run_dir),
        "steps": rows[-1]["step"],
        "first_loss": rows[0][loss],
        "last_loss": rows[-1][loss],
        "loss_curve": [r[loss] for r in rows],
    }
    for key, metric in shown.items():
        stage[key] = [r[metric] for r in rows] if key.endswith("_by_step") else rows[-1][metric]
    return stage


def _scored(stage: dict, before: dict) -> dict:
    """`stage` with the held-out prompts its checkpoint solves, and the verifier's solve rate from its
    start (`before`: the previous stage's held_out) to its end."""
    after = held_out_solved(Path(stage["run_dir"]) / "checkpoints")
    stage["held_out_exact"] = {"before": before["solved"] / before["of"], "after": after["solved"] / after["of"]}
    stage["held_out"] = after
    return stage


def run_chat_demo(run_dir: str | Path, overrides: Sequence[str] = (), progress: bool = True) -> dict:
    """The stages of the module docstring, each an ordinary run directory under `run_dir`: the base
    model, the chat data, SFT, DPO (scored on held-out pairs too) and RL; then the plot and
    RUN_DIR/summary.json. Returns the summary."""
    run_dir = Path(run_dir)
    base = run_demo(run_dir / "base", progress=progress)
    data = _tokenized(run_dir)
    summary = {"run_dir": str(run_dir), "base": {"run_dir": base["run_dir"]}}
    summary["base"]["held_out"] = held_out_solved(run_dir / "base" / "checkpoints")
    base_ckpt, sft_ckpt, dpo_ckpt = (run_dir / name / "checkpoints" for name in ("base", "sft", "dpo"))
    sft = _stage("tiny_sft", run_dir / "sft", data["sft"], base_ckpt, overrides, progress)
    summary["sft"] = _scored(sft, summary["base"]["held_out"])
    dpo_stage = _stage(
        "tiny_dpo",
        run_dir / "dpo",
        data["prefs"],
        sft_ckpt,
        overrides,
        progress,
        last_accuracy="train/rewards/accuracy",
        last_margin="train/rewards/margins",
    )
    summary["dpo"] = _scored(dpo_stage, summary["sft"]["held_out"])
    summary["dpo"]["preference_accuracy"] = held_out_preference_accuracy(data["prefs_heldout"], sft_ckpt, dpo_ckpt)
    # the rollouts' mean reward (grpo.reward_scale x the verifier's score) per step
    rl = _stage(
        "tiny_grpo",
        run_dir / "rl",
        data["rl"],
        dpo_ckpt,
        overrides,
        progress,
        reward_by_step="rollout/reward_mean",
        slot_efficiency="rollout/slot_efficiency_run",  # the whole stage's decoding, at its last step
        staleness_by_step="rollout/staleness_mean",
    )
    summary["rl"] = _scored(rl, summary["dpo"]["held_out"])
    summary["plot"] = str(run_dir / "post_training.png")
    _plot(summary, run_dir / "post_training.png")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _plot(s: dict, path: Path) -> None:
    fig, (sft, dpo, rl, held) = plt.subplots(1, 4, figsize=(18, 4))
    sft.plot(range(1, len(s["sft"]["loss_curve"]) + 1), s["sft"]["loss_curve"])
    sft.set_title("SFT: CE loss on assistant tokens")
    dpo.plot(range(1, len(s["dpo"]["loss_curve"]) + 1), s["dpo"]["loss_curve"])
    dpo.set_title(f"DPO: dpo_norm loss (held-out pairs: accuracy {s['dpo']['preference_accuracy']:.2f})")
    rl.plot(range(1, len(s["rl"]["reward_by_step"]) + 1), s["rl"]["reward_by_step"])
    rl.set_title("RL (GRPO): mean reward of the rollouts")
    for ax in (sft, dpo, rl):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    # after each stage: what the verifier credits beside the sums the model knows in any form
    stages = ("base", "sft", "dpo", "rl")
    x = range(len(stages))
    held.bar([i - 0.2 for i in x], [s[k]["held_out"]["answered"] for k in stages], 0.4, label="right number")
    held.bar([i + 0.2 for i in x], [s[k]["held_out"]["solved"] for k in stages], 0.4, label="verifier: solved")
    held.set_xticks(list(x), stages)
    held.set_title(f"held-out prompts (of {s['rl']['held_out']['of']}), greedy")
    held.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_chat_summary(s: dict) -> str:
    def solved(stage):
        h = s[stage]["held_out"]
        return (
            f"{h['solved']}/{h['of']} held-out sums solved ({h['formatted']} boxed an answer; "
            f"{h['answered']} ended on the right number)"
        )

    lines = [f"base  {solved('base')}"]
    sft = s["sft"]
    lines.append(f"sft   {sft['steps']} steps, CE {sft['first_loss']:.3f} -> {sft['last_loss']:.3f}; {solved('sft')}")
    lines.append(
        f"dpo   {s['dpo']['steps']} steps, loss {s['dpo']['first_loss']:.3f} -> {s['dpo']['last_loss']:.3f}, "
        f"preference accuracy {s['dpo']['preference_accuracy']:.2f} on held-out pairs; {solved('dpo')}"
    )
    rl = s["rl"]
    lines.append(
        f"rl    {rl['steps']} steps, reward {rl['reward_by_step'][0]:.2f} -> {rl['reward_by_step'][-1]:.2f} "
        f"(of {get_recipe('tiny_grpo').grpo.reward_scale:g}); {solved('rl')}; rollouts' slot efficiency "
        f"{rl['slot_efficiency']:.2f}, staleness {sum(rl['staleness_by_step']) / len(rl['staleness_by_step']):.2f} "
        "rollouts (the mean over the steps)"
    )
    example = s["rl"]["held_out"]["examples"][0]
    lines += [
        f"e.g.  {example['prompt']!r} -> {example['answer']!r} (truth {example['truth']})",
        f"plot  {s['plot']}",
        f"runs  {s['run_dir']}/{{base,sft,dpo,rl}} (olmax status; olmax generate --chat instruct --ckpt ...)",
    ]
    return "\n".join(lines)
