"""Training FLOPs per device per step, in two conventions, and the MFU a measured step time implies.

Both conventions count only matrix multiplications (2 FLOPs per multiply-add) and take a training
step as 3x the forward pass: the backward pass runs two matmuls of the forward's size for each
forward matmul (the gradient with respect to each operand). Elementwise work (norms, softmax, RoPE,
SiLU, the loss) is left out; for the 7B it is well under 1% of the total.

- `maxtext`: the number MaxText logs for OLMo 3 (its `calculate_tflops_training_per_device`, the
  plain decoder path): weight FLOPs over the tokenizer's vocabulary (100278, not the padded
  embedding), and every layer's attention counted as GLOBAL causal attention, T^2/2 query-key pairs,
  ignoring the sliding window. This is the convention of the MaxText write-up's MFU figures.
- `exact`: the model FLOPs olmax runs: the LM head over the padded vocabulary (olmax and OLMo-core
  compute all padded logits), and each layer's attention over exactly the (query, key) pairs its
  mask allows: T(T+1)/2 on a global layer, about T*W on a layer with a window of W.

Rows that only feed a statistic (`forward_only`: KTO's KL rows, olmax.objectives.logps.statistic_logps,
their forward under stop_gradient) run a forward and no backward: 1 of a trained row's 3 passes (2N of
6N a token), in both conventions; XLA's count of a KTO step says the same
(tests/objectives/test_kto_plugin.py).

`docs/flops.md` writes both formulas out and gives the 7B figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from olmax.config.model import ModelConfig
from olmax.config.remat import ATTENTION_TAG
from olmax.errors import ConfigError
from olmax.model.attention import BACKENDS, NAMED_RESIDUALS
from olmax.model.olmo3 import count_params

# Forward + backward = 3 forward passes of matmul work (see the module docstring).
TRAIN_PASSES = 3


def per_device_batch_of(global_batch: int, devices: int) -> int:
    """Sequences per device when `devices` share a global batch of `global_batch` sequences."""
    if devices <= 0:
        raise ConfigError(f"--total-devices must be positive, got {devices}")
    if global_batch % devices:
        raise ConfigError(
            f"trainer.global_batch {global_batch} does not split over --total-devices {devices}; "
            "give --per-device-batch or a global batch the devices divide"
        )
    return global_batch // devices


def attended_pairs(seq_len: int, window: Optional[int]) -> int:
    """(query, key) pairs a causal attention over `seq_len` tokens computes.

    Query i sees keys max(0, i - W + 1) .. i, i.e. min(i + 1, W) of them (window None = global).
    """
    if window is None or window >= seq_len:
        return seq_len * (seq_len + 1) // 2
    return window * (window + 1) // 2 + (seq_len - window) * window


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step (forward + backward) on one device."""

    weights: int  # matmuls against a weight matrix: q/k/v/o projections, MLP, LM head
    attention: int  # scores q.k^T and probs.v

    @property
    def total(self) -> int:
        return self.weights + self.attention


def _weight_flops_per_token(cfg: ModelConfig, vocab: int) -> int:
    """Forward FLOPs per token of every matmul with a weight (the embedding lookup is a gather)."""
    d, hd = cfg.d_model, cfg.head_dim
    attn = d * (cfg.n_heads + 2 * cfg.n_kv_heads) * hd + cfg.n_heads * hd * d  # q, k, v in; o out
    mlp = 3 * d * cfg.mlp_hidden  # gate, up, down
    return 2 * (cfg.n_layers * (attn + mlp) + d * vocab)


def _attention_flops_per_pair(cfg: ModelConfig) -> int:
    """Forward FLOPs per (query, key) pair: a head_dim dot for the score and one for the value, per
    query head (grouped-query attention shares k and v but not this work)."""
    return 2 * 2 * cfg.n_heads * cfg.head_dim


def _check_shape(seq_len: int, batch: int) -> None:
    if seq_len <= 0:
        raise ConfigError(f"seq_len must be positive, got {seq_len}")
    if batch <= 0:
        raise ConfigError(f"per_device_batch must be positive, got {batch}")


def _passes(batch: int, forward_only: int) -> int:
    """Forward passes of matmul work: 3 a trained row, 1 a row that only feeds a statistic (module doc)."""
    if forward_only < 0:
        raise ConfigError(f"forward-only rows must be 0 or more, got {forward_only}")
    return TRAIN_PASSES * batch + forward_only


def maxtext_step_flops(cfg: ModelConfig, seq_len: int, batch: int, forward_only: int = 0) -> StepFlops:
    """MaxText's convention: unpadded vocab, every layer global causal with T^2/2 pairs. `batch` rows
    trained, `forward_only` more that only feed a statistic."""
    _check_shape(seq_len, batch)
    passes = _passes(batch, forward_only)
    weights = passes * seq_len * _weight_flops_per_token(cfg, cfg.vocab_size)
    # T^2/2 pairs per layer as MaxText writes it: half the square, without the diagonal's extra T/2
    # (the per-pair count is even, so the halving is exact in integers).
    square = seq_len * seq_len * _attention_flops_per_pair(cfg)
    attention = passes * cfg.n_layers * square // 2
    return StepFlops(weights=weights, attention=attention)


def exact_step_flops(cfg: ModelConfig, seq_len: int, batch: int, forward_only: int = 0) -> StepFlops:
    """The matmuls olmax's model performs: padded vocab, each layer's exact causal/window pairs. `batch`
    rows trained, `forward_only` more that only feed a statistic."""
    _check_shape(seq_len, batch)
    passes = _passes(batch, forward_only)
    weights = passes * seq_len * _weight_flops_per_token(cfg, cfg.padded_vocab_size)
    pairs = sum(attended_pairs(seq_len, cfg.layer_window(i)) for i in range(cfg.n_layers))
    attention = passes * pairs * _attention_flops_per_pair(cfg)
    return StepFlops(weights=weights, attention=attention)


def _check_step_time(step_time: float, exact: StepFlops, peak_tflops: Optional[float]) -> None:
    """A step cannot be faster than its exact matmul FLOPs at the peak: such a step time (an MFU above
    100% on the exact count) is a wrong input, not a figure. MaxText's count, higher for windowed
    models, may still exceed 100% for a possible step time."""
    if peak_tflops is None:
        return
    fastest = exact.total / 1e12 / peak_tflops
    if step_time < fastest:
        raise ConfigError(
            f"--step-time {step_time:g} s is impossible: this step's {exact.total / 1e12:.4g} TFLOP per device take at "
            f"least {fastest:.4g} s at the peak {peak_tflops:g} TFLOP/s (MFU {fastest / step_time:.0%}); "
            "check --step-time, the batch, --total-devices and the chip"
        )


def flops_report(
    cfg: ModelConfig,
    *,
    seq_len: int,
    per_device_batch: int,
    forward_only_batch: int = 0,
    devices: int = 1,
    peak_tflops: Optional[float] = None,
    step_time: Optional[float] = None,
) -> dict:
    """Parameters, tokens and TFLOP per device per step in both conventions; with a step time the
    achieved TFLOP/s, and with a peak as well the MFU (model FLOPs / (step time * peak)).
    `per_device_batch` rows trained on each device, `forward_only_batch` more that only feed a
    statistic (a forward each; their tokens count)."""
    if devices <= 0:
        raise ConfigError(f"devices must be positive, got {devices}")
    if step_time is not None and step_time <= 0:
        raise ConfigError(f"step time must be positive, got {step_time}")
    maxtext = maxtext_step_flops(cfg, seq_len, per_device_batch, forward_only_batch)
    exact = exact_step_flops(cfg, seq_len, per_device_batch, forward_only_batch)
    tokens_per_device = (per_device_batch + forward_only_batch) * seq_len
    report = {
        "params": count_params(cfg),
        "seq_len": seq_len,
        "per_device_batch": per_device_batch,
        "forward_only_per_device_batch": forward_only_batch,
        "devices": devices,
        "tokens_per_device_step": tokens_per_device,
        "tokens_per_step": tokens_per_device * devices,
        "tflops_per_device_step_maxtext": maxtext.total / 1e12,
        "tflops_per_device_step_exact": exact.total / 1e12,
        "tflops_breakdown": {
            "maxtext": {"weights": maxtext.weights / 1e12, "attention": maxtext.attention / 1e12},
            "exact": {"weights": exact.weights / 1e12, "attention": exact.attention / 1e12},
        },
        "exact_below_maxtext": 1.0 - exact.total / maxtext.total,
        "peak_tflops_per_device": peak_tflops,
        "step_time_s": step_time,
        "tokens_per_s": None,
        "tflops_per_device_per_s_maxtext": None,
        "tflops_per_device_per_s_exact": None,
        "mfu_maxtext": None,
        "mfu_exact": None,
    }
    if step_time is not None:
        _check_step_time(step_time, exact, peak_tflops)
        report["tokens_per_s"] = tokens_per_device * devices / step_time
        for name, flops in (("maxtext", maxtext), ("exact", exact)):
            achieved = flops.total / 1e12 / step_time
            report[f"tflops_per_device_per_s_{name}"] = achieved
            if peak_tflops is not None:
                report[f"mfu_{name}"] = achieved / peak_tflops
    return report


def format_report(report: dict) -> str:
    """A short human-readable table of a `flops_report`."""
    forward_only = report["forward_only_per_device_batch"]
    forward_only = f" + {forward_only} forward-only" if forward_only else ""
    lines = [
        f"params                        {report['params']:,}",
        f"tokens per step               {report['tokens_per_step']:,} "
        f"({report['per_device_batch']}{forward_only} x {report['seq_len']} on each of {report['devices']} devices)",
        f"TFLOP per device per step     maxtext {report['tflops_per_device_step_maxtext']:.3f}   "
        f"exact {report['tflops_per_device_step_exact']:.3f}   "
        f"(exact {100 * report['exact_below_maxtext']:.2f}% lower)",
    ]
    if report["step_time_s"] is not None:
        lines.append(
            f"TFLOP/s per device            maxtext {report['tflops_per_device_per_s_maxtext']:.1f}   "
            f"exact {report['tflops_per_device_per_s_exact']:.1f}   ({report['tokens_per_s']:,.0f} tokens/s)"
        )
    if report["mfu_maxtext"] is not None:
        lines.append(
            f"MFU (peak {report['peak_tflops_per_device']:g} TFLOP/s)   "
            f"maxtext {100 * report['mfu_maxtext']:.2f}%   exact {100 * report['mfu_exact']:.2f}%"
        )
    return "\n".join(lines)


# The forward matmul each tagged activation comes out of (olmax.config.remat.REMAT_TAGS); a tag missing
# here (layer_input, attn_context) costs no weight matmul to recompute.
def _tag_matmul_flops_per_token(cfg: ModelConfig) -> dict[str, int]:
    d, hd, f = cfg.d_model, cfg.head_dim, cfg.mlp_hidden
    return {
        "q_proj": 2 * d * cfg.n_heads * hd,
        "k_proj": 2 * d * cfg.n_kv_heads * hd,
        "v_proj": 2 * d * cfg.n_kv_heads * hd,
        "o_proj": 2 * cfg.n_heads * hd * d,
        "mlp_gate": 2 * d * f,
        "mlp_up": 2 * d * f,
        "mlp_down": 2 * f * d,
    }


def recompute_flops(
    cfg: ModelConfig, seq_len: int, batch: int, saved: Optional[tuple[str, ...]], *, backend: str
) -> int:
    """Forward matmul FLOPs per device per step that rematerialisation runs again in the backward
    pass, keeping the tagged activations `saved` (None: no rematerialisation, nothing recomputed),
    with the attention backend `backend` (a name of attention.BACKENDS, resolved: not `auto`).

    Every weight matmul whose output is not kept is recomputed (the backward pass reads each one's
    output, or needs it to rebuild one it reads). Attention's forward is recomputed unless what its
    backward reads, the output and each row's log-sum-exp, is kept: `attn_context` kept on a backend
    that names both (attention.NAMED_RESIDUALS: splash, xla; MaxText's splash, which names both
    `context`, counts as splash). cudnn names only its output, so its forward always runs again.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; resolve it first (known: {', '.join(BACKENDS)})")
    if saved is None:
        return 0
    _check_shape(seq_len, batch)
    per_token = sum(f for tag, f in _tag_matmul_flops_per_token(cfg).items() if tag not in saved)
    weights = cfg.n_layers * batch * seq_len * per_token
    pairs = sum(attended_pairs(seq_len, cfg.layer_window(i)) for i in range(cfg.n_layers))
    attention_kept = ATTENTION_TAG in saved and backend in NAMED_RESIDUALS
    attention = 0 if attention_kept else batch * pairs * _attention_flops_per_pair(cfg)
    return weights + attention
