"""Rollouts: the KV cache (cache.py), the one jitted sampling loop for GRPO, `olmax generate` and
lm-eval's generate_until (sampler.py), and text in / text out (text.py). docs/rollout.md."""
