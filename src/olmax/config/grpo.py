"""The `grpo` section (GRPO's loss and the RL loop's settings, trainer.objective=grpo) and the
`rewards` section (the verifiers' settings); GRPO trains on rollouts (what such an objective refuses of
the other sections is olmax.config.data_kind.check_rollouts; GRPOConfig.check adds the packed row's
length). docs/post-training/grpo.md.

Defaults are AI2's OlmoRL settings where the two OLMo 3 7B RL runs agree: open-instruct
`scripts/train/olmo3/7b_think_rl.sh` (commit 42aa63c) and `7b_instruct_rl.sh` (9ade62d), the flags
they pass to `open_instruct/grpo_fast.py`, not grpo_fast.py's own defaults (olmax.objectives.grpo).
Where they differ the default is the code's "off" (tis_cap 0, no active sampling) or one run's
value, said in the field's help; the recipes (olmax.config.recipes) set each run's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional, Union

from olmax.config.data import CHAT_TEMPLATES
from olmax.config.objective import ObjectiveConfig
from olmax.config.remat import AUTO
from olmax.errors import ConfigError


@dataclass(frozen=True)
class GRPOConfig(ObjectiveConfig):
    """GRPO as open-instruct's grpo_fast.py ran it for OLMo 3, used with trainer.objective=grpo
    (olmax.objectives.grpo). The train step reads the loss knobs (temperature, clip_low, clip_high,
    tis_cap, beta); the rest are the RL loop's (sampling, rewards, batch selection)."""

    data: ClassVar[str] = "rollouts"

    prompts_per_step: int = 64
    """Prompts sampled per rollout batch (open-instruct --num_unique_prompts_rollout; 64 in both runs)."""
    samples_per_prompt: int = 8
    """Responses sampled per prompt, the group whose mean reward is the baseline (--num_samples_per_prompt_rollout)."""
    temperature: float = 1.0
    """Sampling temperature; the training logits are divided by temperature + 1e-7 as open-instruct's
    forward does, so the trainer's log-probs are the sampler's distribution's."""
    clip_low: float = 0.2
    """PPO clip below: the ratio is clipped at 1 - clip_low (--clip_lower)."""
    clip_high: float = 0.272
    """PPO clip above: the ratio is clipped at 1 + clip_high (--clip_higher; DAPO's asymmetric clip)."""
    tis_cap: float = 0.0
    """Truncated importance sampling: each token's loss is weighted by min(exp(logp_old - logp_sampler),
    tis_cap); 0 = off (--truncated_importance_sampling_ratio_cap: 2.0 Think, off Instruct). Needs the
    batch's sampler_logps."""
    beta: float = 0.0
    """Weight of the kl3 penalty against a reference policy; 0 = none (both runs). Needs the batch's ref_logps."""
    normalise_std: bool = False
    """Divide advantages by the group's reward std + 1e-8 (open-instruct "standard"); false = centred only,
    reward - group mean (--advantage_normalization_type centered, both runs)."""
    reward_scale: float = 10.0
    """Reward of a verified-correct response (open-instruct verification_reward): rewards are this x the
    verifier's score, and a group's pass rate is its mean reward / this."""
    filter_zero_spread: bool = True
    """Drop groups whose rewards are all equal (no learning signal; open-instruct filter_zero_std_samples,
    on in both runs)."""
    active_sampling: bool = False
    """Keep sampling until prompts_per_step groups survive the zero-spread filter (--active_sampling:
    Instruct); false = one pass of prompts_per_step prompts, training on the survivors (Think)."""
    no_resampling_pass_rate: Optional[float] = None
    """A prompt whose group's pass rate is at least this is not sampled again after the epoch
    (--no_resampling_pass_rate: 0.875 Instruct); null = every prompt stays."""
    max_prompt_len: int = 2048
    """Prompt tokens at most (--max_prompt_token_length; 2048 in both runs)."""
    max_response_len: int = 8192
    """Response tokens at most (--response_length: 32,768 Think, 8,192 Instruct). max_prompt_len +
    max_response_len must fit data.seq_len, the packed row (open-instruct's pack_length assert)."""
    mini_batches: int = 1
    """Optimizer steps per rollout batch (--num_mini_batches: 1 Think, 4 Instruct). With more than one
    the loop computes old_logps of the whole batch before the first step (olmax.objectives.grpo)."""
    rollout_engine: str = "continuous"
    """How rollouts are decoded (docs/rollout.md): "continuous" = the slot engine (olmax.rollout.engine):
    a fixed number of slots (grpo.slots) decode together, a row that stops leaves its slot and the next
    waiting row takes it, groups are verified as they finish, and rows may carry into the next steps
    under grpo.max_staleness; "static" = the static sampler: each step's prompts decoded as one batch
    until its longest row stops."""
    slots: Union[int, str] = "auto"
    """The continuous engine's slots (rows decoded at once): a multiple of the mesh's data x fsdp devices;
    auto = the rows of grpo.sample_prompts' prompts (all of a step's, prompts_per_step x
    samples_per_prompt, where they fit the chip)."""
    kv_gib: float = 0.0
    """The continuous engine's KV cache as a pool of pages of this many GiB (docs/rollout-engine.md):
    rows take pages as they grow, so more slots fit than whole rings would (the 1B at 64 slots of 2176
    positions on one v5e: 9 GiB of pages for 17 GiB of rings); a row that finds none free is preempted
    and prefilled again later, its tokens kept. 0 = each slot holds a whole ring of max_prompt_len +
    max_response_len positions. One device only."""
    max_staleness: int = 1
    """The continuous engine's in-flight updates: a rollout may train on tokens drawn up to this many
    rollouts ago (a rollout is grpo.mini_batches optimizer steps; open-instruct's --async_steps with
    --inflight_updates: 8 in the OLMo 3 scripts at 3af17aa, whose rollouts are one step each).
    Admission control, not discarding: groups enter the engine only while at most max_staleness + 1
    rollouts' worth are unconsumed, and each is read within max_staleness rollouts of entering, so no
    row is dropped for being stale (dropping them would bias training towards short answers); a row
    that spans an update keeps its earlier tokens' log-probs (the sampler's, per token) for
    grpo.tis_cap to correct. 0 = synchronous: each rollout is sampled with the parameters it starts
    from, the same rollouts as the static engine."""
    read_order: str = "prompt"
    """The order in which the continuous engine's groups are read: "prompt" = the order the prompts were
    taken (a step waits for its oldest group); "completion" = the order in which their rows finished,
    as open-instruct's OlmoRL takes them from its vLLM engines (a group admitted max_staleness rollouts
    ago is read next all the same). The static engine reads in prompt order."""
    async_steps: int = 0
    """The static engine's rollouts sampled ahead (open-instruct --async_steps; the OLMo 3 Think script at
    3af17aa ran 8 on separate vLLM GPUs): 0 = synchronous, each rollout sampled with the parameters it is
    trained from; 1 = the next rollout is sampled and verified, by a worker thread, while the steps on
    this one run, with the parameters from before them (one rollout off-policy). Sampler and trainer share
    the mesh, so only the host's work (verifying, packing) overlaps the device's; more lag would buy no
    more overlap, hence at most 1. Costs one more copy of the parameters (docs/post-training/rl-loop.md).
    The continuous engine's lag is grpo.max_staleness."""
    stop: tuple[str, ...] = ()
    """Strings that end a response besides the end-of-turn token (--stop_strings: "</answer>" Instruct,
    none Think), matched on the decoded text as vLLM does, however the model spelled them in tokens:
    the response ends at the token completing one, and the verifier's text is cut right after it
    (olmax.rollout.text)."""
    template: str = "instruct"
    """The chat template the prompts are rendered with, generation prompt included (olmax.data.chat:
    "think_dpo_rl" for the Think run, open-instruct's olmo_thinker, whose default system prompt is not
    the Think SFT template's ("think"); "instruct" for the Instruct run)."""
    sample_prompts: Union[int, str] = "auto"
    """Prompts per sampler program: a rollout samples its prompts this many at a time (their
    samples_per_prompt rows each), one program after another, so the KV cache holds only their rows;
    0 = all of the step's prompts in one program; auto = all of them where that fits the chip's
    budget (and on CPU), else the largest power of two that does, found by compiling on the run's
    devices and recorded in the run directory (olmax.rollout.compile_decode.choose_sample_prompts). The
    tokens are the same either way, the log-probs to float32 rounding (olmax.rollout.sampler.sample);
    `olmax compile-check --decode` shows the search on a TPU topology or GPU cluster."""

    def __post_init__(self):
        for name in ("prompts_per_step", "max_prompt_len", "max_response_len", "mini_batches"):
            if getattr(self, name) < 1:
                raise ConfigError(f"grpo.{name} must be positive, got {getattr(self, name)}")
        if self.sample_prompts != AUTO and not (isinstance(self.sample_prompts, int) and self.sample_prompts >= 0):
            raise ConfigError(
                "grpo.sample_prompts must be auto or an integer >= 0 (0 = all prompts at once), "
                f"got {self.sample_prompts!r}"
            )
        if self.samples_per_prompt < 2:  # a group of one has no spread: its advantage is always 0
            raise ConfigError(f"grpo.samples_per_prompt must be at least 2 (a group), got {self.samples_per_prompt}")
        if self.template not in CHAT_TEMPLATES:
            raise ConfigError(f"grpo.template={self.template!r} is not one of {', '.join(CHAT_TEMPLATES)}")
        for name in ("temperature", "reward_scale"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"grpo.{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.clip_low < 1.0:
            raise ConfigError(f"grpo.clip_low must be in [0, 1), got {self.clip_low}")
        for name in ("clip_high", "tis_cap", "beta"):
            if getattr(self, name) < 0:
                raise ConfigError(f"grpo.{name} must be >= 0, got {getattr(self, name)}")
        if self.rollout_engine not in ROLLOUT_ENGINES:
            raise ConfigError(f"grpo.rollout_engine={self.rollout_engine!r} is not one of {', '.join(ROLLOUT_ENGINES)}")
        if self.slots != AUTO and not (isinstance(self.slots, int) and self.slots >= 1):
            raise ConfigError(f"grpo.slots must be auto or a positive integer, got {self.slots!r}")
        if self.kv_gib < 0:
            raise ConfigError(f"grpo.kv_gib must be >= 0 (0: whole rings), got {self.kv_gib}")
        if self.kv_gib and self.rollout_engine == "static":
            raise ConfigError(
                f"grpo.kv_gib={self.kv_gib:g} pages the continuous engine's KV cache; the static sampler keeps "
                "whole rings (or set grpo.rollout_engine=continuous)"
            )
        if self.read_order not in READ_ORDERS:
            raise ConfigError(f"grpo.read_order={self.read_order!r} is not one of {', '.join(READ_ORDERS)}")
        if self.read_order != "prompt" and self.rollout_engine == "static":
            raise ConfigError(
                f"grpo.read_order={self.read_order} is the continuous engine's; the static engine's groups all "
                "finish together and are read in prompt order (or set grpo.rollout_engine=continuous)"
            )
        if self.max_staleness < 0:
            raise ConfigError(f"grpo.max_staleness must be >= 0 (0: synchronous), got {self.max_staleness}")
        if self.rollout_engine == "continuous" and self.async_steps:
            raise ConfigError(
                f"grpo.async_steps={self.async_steps} is the static engine's lag; the continuous engine's is "
                "grpo.max_staleness (or set grpo.rollout_engine=static)"
            )
        if self.async_steps not in (0, 1):
            raise ConfigError(
                f"grpo.async_steps must be 0 or 1, got {self.async_steps}: sampler and trainer share one mesh, "
                "so a rollout sampled further ahead is only more off-policy, not faster"
            )
        rate = self.no_resampling_pass_rate
        if rate is not None and not 0.0 < rate <= 1.0:
            raise ConfigError(f"grpo.no_resampling_pass_rate must be in (0, 1] or null, got {rate}")
        if self.active_sampling and not self.filter_zero_spread:
            raise ConfigError(
                "grpo.active_sampling refills the groups the zero-spread filter drops: "
                "it needs grpo.filter_zero_spread=true"
            )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"grpo.stop must be non-empty strings, got {list(self.stop)}")

    def check(self, cfg) -> None:
        longest = self.max_prompt_len + self.max_response_len
        # open-instruct asserts pack_length >= max_prompt_token_length + response_length
        if longest > cfg.data.seq_len:
            raise ConfigError(
                f"grpo.max_prompt_len + grpo.max_response_len = {longest} does not fit "
                f"data.seq_len={cfg.data.seq_len}, the packed row every prompt + response must fit"
            )


ROLLOUT_ENGINES = ("continuous", "static")  # olmax.rollout.engine, olmax.rollout.sampler
READ_ORDERS = ("prompt", "completion")  # olmax.rollout.stream

# What rewards.code.isolation may name (olmax.rewards.code runs each): the sandbox the machine can make
# (auto), the namespace sandbox asked for by name, or none.
CODE_ISOLATIONS = ("auto", "namespaces", "none")


@dataclass(frozen=True)
class CodeRewardConfig:
    """The code verifier (olmax.rewards.code) as the RL loop runs it."""

    isolation: str = "auto"
    """How generated programs are isolated: auto (the default) = the namespace sandbox (own user, PID,
    network, IPC and mount namespaces, a read-only root of Python alone, a process cap), and the run
    refuses to start where this machine cannot make it; namespaces = the same, asked for by name; none =
    no sandbox, the programs run as the run's own user with its files and network (only on a machine
    that may lose what it runs). docs/rewards.md, "What the sandbox isolates"."""

    def __post_init__(self):
        if self.isolation not in CODE_ISOLATIONS:
            raise ConfigError(f"rewards.code.isolation={self.isolation!r} is not one of {', '.join(CODE_ISOLATIONS)}")


@dataclass(frozen=True)
class RewardsConfig:
    """The verifiers' settings (olmax.rewards), read by the RL loop."""

    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)
    """The code and code_stdio verifiers."""
