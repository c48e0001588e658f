"""Tiny models that several test files share."""

import jax
import jax.numpy as jnp

from olmax.model.olmo3 import init_params


def random_params(cfg, key) -> dict:
    """OLMo-core's init, but with every norm weight drawn from U(0.5, 1.5) instead of 1, so a norm
    that is applied in the wrong place (or not at all) changes the outputs."""
    params = init_params(cfg, key)
    norms = {"q_norm", "k_norm", "attn_norm", "mlp_norm", "final_norm"}
    flat, treedef = jax.tree.flatten_with_path(params)
    keys = jax.random.split(jax.random.fold_in(key, 1), len(flat))
    out = []
    for (path, leaf), k in zip(flat, keys):
        if path[-1].key in norms:
            leaf = jax.random.uniform(k, leaf.shape, jnp.float32, 0.5, 1.5).astype(leaf.dtype)
        out.append(leaf)
    return jax.tree.unflatten(treedef, out)
