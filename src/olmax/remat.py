"""Rematerialisation: the activations a transformer block names with `checkpoint_name`
(olmax.model.olmo3 tags them, olmax.model.attention tags attention's) and the policies, sets of
those names, that `model.remat` selects: what a block keeps for its backward pass, the rest being
recomputed (docs/model.md, docs/performance.md)."""

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


def remat_policy_of(remat: str) -> Optional[RematPolicy]:
    """The policy of a model.remat value: a name of REMAT_POLICIES, or the tags to keep separated by
    commas ("q_proj,k_proj,v_proj,attn_context"; a YAML list of tags is joined so by config_io)."""
    if remat in REMAT_POLICIES:
        return REMAT_POLICIES[remat]
    tags = [t.strip() for t in remat.split(",") if t.strip()]
    unknown = [t for t in tags if t not in REMAT_TAGS]
    if not tags or unknown:
        what = f"unknown tag {', '.join(map(repr, unknown))}" if unknown else "no policy or tag"
        raise ConfigError(
            f"model.remat={remat!r}: {what}; give a policy ({', '.join(REMAT_POLICIES)}) or the tags to keep, "
            f"comma-separated, from {', '.join(REMAT_TAGS)}"
        )
    return RematPolicy(save=tuple(t for t in REMAT_TAGS if t in tags))
