"""Rematerialisation: the activations a transformer block names with `checkpoint_name`
(olmax.model.olmo3 tags them, olmax.model.attention tags attention's) and the policies, sets of
those names, that `model.remat` selects: what a block keeps for its backward pass, the rest being
recomputed; and the sets `model.remat=auto` chooses from (olmax.fit.remat; docs/model.md,
docs/performance/remat.md). Names only, no jax: the model applies the policies (olmax.model.olmo3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from olmax.errors import ConfigError


@dataclass(frozen=True)
class RematPolicy:
    """What a rematerialised block keeps for its backward pass; the rest is recomputed. Both are
    sets of the block's named activations (REMAT_TAGS)."""

    save: tuple[str, ...] = ()
    """Tagged activations kept in device memory."""
    offload: tuple[str, ...] = ()
    """Tagged activations moved to host memory and back (TPU and GPU only)."""


# Attention's result is named by the attention backends (olmax.model.attention), not by the block:
# what the backward pass of a fused kernel reads is its output in the kernel's own layout (heads
# first) and each row's log-sum-exp, and only a backend can name those. splash and xla name both, so
# keeping this tag spares the backward pass attention's forward; cudnn (jax.nn.dot_product_attention,
# whose residuals cannot be named) names only its output, and its backward still reruns the forward.
# The block does not tag the (batch, seq, heads x head_dim) view it feeds the output projection: a
# second, transposed copy of the same values (8 GiB on the 7B at 4 x 8192 tokens per device).
ATTENTION_TAG = "attn_context"

# The activations a block names with checkpoint_name, in the order they are computed: the block's
# input, the attention projections (before the QK-norm), attention's result (ATTENTION_TAG), the
# output projection (before its norm), and the MLP's three matmuls (down: before its norm). Every
# weight matmul of the block is one of the *_proj / mlp_* tags.
REMAT_TAGS = (
    "layer_input",
    "q_proj",
    "k_proj",
    "v_proj",
    ATTENTION_TAG,
    "o_proj",
    "mlp_gate",
    "mlp_up",
    "mlp_down",
)
_QKV = ("q_proj", "k_proj", "v_proj")


# The remat table: model.remat -> policy, None = no rematerialisation. Named, as MaxText's
# `remat_policy` is, by what they save (MaxText src/MaxText/layers/decoders.py, get_remat_policy);
# model.remat may also be a set of tags to keep (remat_policy_of).
REMAT_POLICIES: dict[str, Optional[RematPolicy]] = {
    "none": None,
    "full": RematPolicy(),
    # every weight matmul's output; only the elementwise work and attention are recomputed
    "save_dots": RematPolicy(save=_QKV + ("o_proj", "mlp_gate", "mlp_up", "mlp_down")),
    "save_qkv_proj": RematPolicy(save=_QKV),
    "save_qkv_out_proj": RematPolicy(save=_QKV + ("o_proj",)),
    # the attention half's outputs: the backward pass recomputes the MLP's input from the block
    # input and o_proj (a norm and an add), and the MLP
    "save_attn_mlp_inputs": RematPolicy(save=_QKV + ("attn_context", "o_proj")),
    "offload_qkv_proj": RematPolicy(offload=_QKV),
    "offload_qkv_out_proj": RematPolicy(offload=_QKV + ("o_proj",)),
}


# model.remat=auto: the policy and the backward pass's order are chosen for the devices the step
# compiles for (olmax.fit.remat_search), before the step is built.
AUTO = "auto"

# The sets `auto` tries, most kept first, each a subset of the one above, so a step's memory falls
# (as measured) down the ladder, which its bisection relies on: every weight matmul's output and
# attention's (nothing recomputed but elementwise work); without the MLP's up projection (the MaxText
# seeds' set); without its gate as well (the gate and up tensors are the MLP's width, 2.7x the
# model's); without the down projection; the q/k/v projections alone (attention's forward runs
# again); nothing but the block's input. The first three are what the recipes measured on their own
# slices (docs/performance/remat.md, "The other rows of the sweep").
SEEDS = "q_proj,k_proj,v_proj,attn_context,o_proj,mlp_gate,mlp_down"
AUTO_LADDER = (
    SEEDS + ",mlp_up",
    SEEDS,
    "q_proj,k_proj,v_proj,attn_context,o_proj,mlp_down",
    "q_proj,k_proj,v_proj,attn_context,o_proj",
    "q_proj,k_proj,v_proj",
    "full",
)


def check_remat(remat: str, serial: bool) -> None:
    """ModelConfig's check of model.remat and model.remat_serial (ConfigError naming the fault)."""
    if remat != AUTO:
        remat_policy_of(remat)
    elif serial:
        raise ConfigError(
            "model.remat_serial=true with model.remat=auto: auto chooses the backward pass's order too; "
            "give the tags to keep (model.remat=q_proj,...) to set the order yourself"
        )


def remat_policy_of(remat: str) -> Optional[RematPolicy]:
    """The policy of a model.remat value: a name of REMAT_POLICIES, or the tags to keep separated by
    commas ("q_proj,k_proj,v_proj,attn_context"; a YAML list of tags is joined so by config_io).
    `auto` has none until it is chosen for a step's devices (olmax.fit.remat.choose_remat)."""
    if remat == AUTO:
        raise ConfigError(
            "model.remat=auto is chosen for the devices a step compiles for (olmax train and "
            "compile-check choose it); here no step is being built for devices"
        )
    if remat in REMAT_POLICIES:
        return REMAT_POLICIES[remat]
    tags = [t.strip() for t in remat.split(",") if t.strip()]
    unknown = [t for t in tags if t not in REMAT_TAGS]
    if not tags or unknown:
        what = f"unknown tag {', '.join(map(repr, unknown))}" if unknown else "no policy or tag"
        raise ConfigError(
            f"model.remat={remat!r}: {what}; give {AUTO}, a policy ({', '.join(REMAT_POLICIES)}) or the tags to "
            f"keep, comma-separated, from {', '.join(REMAT_TAGS)}"
        )
    return RematPolicy(save=tuple(t for t in REMAT_TAGS if t in tags))
