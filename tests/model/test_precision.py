"""The RMS norm and RoPE against ai2-olmo-core 3.0.0's own modules through torch autograd, values and
gradients, in the precision training uses: bf16 activations, float32 arithmetic inside (OLMo-core's
`full_precision` norm and RoPE). RoPE's gradient is hand-written (a custom VJP whose half-swaps run
in the activations' dtype); the norm's is autodiff's.

Both sides compute in float32 and round once to bf16, so they agree to bf16 rounding: at most one bf16
step (2^-8 relative) on a few elements, exactly everywhere else. The weight gradient, a float32 sum
over tokens, agrees to float32 rounding.

The final norm and the LM head are checked against OLMo-core's `LMHead` as its FSDP mixed-precision
policy runs it in training: every parameter cast to bf16 (`param_dtype=bfloat16`), olmax's kept in
float32 and rounded where used.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
layer_norm = pytest.importorskip("olmo_core.nn.layer_norm")
olmo_rope = pytest.importorskip("olmo_core.nn.rope")

from models import make_olmo_core_model, olmax_config_of  # noqa: E402

from olmax.config.model import ModelConfig  # noqa: E402
from olmax.model.olmo3 import final_norm, lm_head, rms_norm  # noqa: E402
from olmax.model.rope import apply_rope, rope_tables  # noqa: E402

pytestmark = pytest.mark.parity

BF16_STEP = 2.0**-7  # the spacing of bf16 numbers in [1, 2): one rounding step either way


def _bf16(rng, shape, scale=1.0):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    return np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))  # values bf16 holds exactly


def _torch_bf16(x):
    return torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).requires_grad_(True)


def _close_in_bf16(ours, ref):
    """Equal, or one bf16 rounding step apart relative to the element's magnitude, on few elements."""
    ours, ref = np.asarray(ours, np.float32), np.asarray(ref, np.float32)
    off = np.abs(ours - ref) > 0
    assert off.mean() < 0.02, f"{off.mean():.3%} of elements differ"
    assert np.all(np.abs(ours - ref) <= BF16_STEP * np.maximum(np.abs(ref), 1e-30)), np.max(np.abs(ours - ref))


def test_rms_norm_gradient_matches_olmo_core():
    rng = np.random.default_rng(0)
    x, g = _bf16(rng, (2, 16, 256), 3.0), _bf16(rng, (2, 16, 256))
    w = (1.0 + 0.1 * rng.standard_normal(256)).astype(np.float32)

    ref = layer_norm.RMSNorm(size=256, eps=1e-6, full_precision=True)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(w))
    xt = _torch_bf16(x)
    yt = ref(xt)
    yt.backward(torch.tensor(g).to(torch.bfloat16))

    y, vjp = jax.vjp(lambda x, w: rms_norm(x, w, 1e-6), jnp.asarray(x, jnp.bfloat16), jnp.asarray(w))
    d_x, d_w = vjp(jnp.asarray(g, jnp.bfloat16))
    assert y.dtype == d_x.dtype == jnp.bfloat16 and d_w.dtype == jnp.float32
    _close_in_bf16(y, yt.float().detach().numpy())
    _close_in_bf16(d_x, xt.grad.float().numpy())
    np.testing.assert_allclose(np.asarray(d_w), ref.weight.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_rope_gradient_matches_olmo_core():
    rng = np.random.default_rng(1)
    b, t, h, d = 2, 32, 4, 64
    q, g = _bf16(rng, (b, t, h, d), 2.0), _bf16(rng, (b, t, h, d))
    k = _bf16(rng, (b, t, h, d))

    cfg = ModelConfig(d_model=h * d, n_heads=h, n_kv_heads=h, head_dim=d, rope_theta=500_000)
    cos, sin = rope_tables(cfg, t, False)
    # OLMo-core rotates with our tables (their entries differ from torch's sin/cos by float32 ulps,
    # which cancellation would magnify): what is compared is the rotation and its gradient
    ref = olmo_rope.RotaryEmbedding(head_size=d, theta=500_000, full_precision=True)
    qt, kt = _torch_bf16(q), _torch_bf16(k)
    tables = {"pos_sin": torch.tensor(np.asarray(sin)), "pos_cos": torch.tensor(np.asarray(cos))}
    q_rot, _ = ref(qt, kt, head_first=False, **tables)
    q_rot.backward(torch.tensor(g).to(torch.bfloat16))
    y, vjp = jax.vjp(lambda x: apply_rope(x, cos, sin), jnp.asarray(q, jnp.bfloat16))
    (d_q,) = vjp(jnp.asarray(g, jnp.bfloat16))
    assert y.dtype == d_q.dtype == jnp.bfloat16
    _close_in_bf16(y, q_rot.float().detach().numpy())
    _close_in_bf16(d_q, qt.grad.float().numpy())


def test_final_norm_and_lm_head_match_olmo_core_in_bf16():
    # OLMo-core's final norm is `lm_head.norm`; the random model's norm weights lie in [0.5, 1.5), most
    # of them between two bf16 numbers, as a trained model's do (at init they are 1, which bf16 holds)
    model = make_olmo_core_model(vocab=384, n_layers=1, seed=3)
    cfg = olmax_config_of(model, 384, compute_dtype="bfloat16")
    head = model.lm_head
    params = {
        "final_norm": jnp.asarray(head.norm.weight.detach().numpy()),
        "lm_head": jnp.asarray(head.w_out.weight.detach().numpy().T),
    }
    assert params["final_norm"].dtype == jnp.float32
    # what FSDP's unsharded parameters are under `MixedPrecisionPolicy(param_dtype=bfloat16)`: each
    # float32 parameter cast to bf16 (Transformer.apply_fsdp, olmo_core/nn/transformer/model.py)
    head = head.to(torch.bfloat16)
    x = _bf16(np.random.default_rng(2), (4, 64, cfg.d_model), 3.0)
    with torch.no_grad():
        xt = torch.tensor(x).to(torch.bfloat16)
        normed_ref, logits_ref = head.norm(xt).float().numpy(), head(xt).float().numpy()

    normed = final_norm(params, jnp.asarray(x, jnp.bfloat16), cfg)
    logits = lm_head(params, normed, cfg)
    assert normed.dtype == jnp.bfloat16 and logits.dtype == jnp.float32
    # (measured: identical, every element)
    _close_in_bf16(normed, normed_ref)
    # OLMo-core's bf16 linear returns bf16 logits; olmax keeps the float32 result of the same dot
    _close_in_bf16(logits.astype(jnp.bfloat16), logits_ref)
    # the bound tells the weights apart: with the final norm's weight left in float32, 29% of the
    # normed elements differ (and 55% of the logits)
    unrounded = rms_norm(jnp.asarray(x, jnp.bfloat16), params["final_norm"], cfg.norm_eps)
    with pytest.raises(AssertionError, match="of elements differ"):
        _close_in_bf16(unrounded, normed_ref)
