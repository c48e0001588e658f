"""Sampling from the model: the ring-buffer KV cache (cache.py), the one jitted sampler for `olmax
generate`, lm-eval and RL (sampler.py), the continuous-batching slot engine (engine.py, its device
programs slots.py), text in / text out (text.py), the RL loop's rollouts (producer.py: prompts ->
sample -> verify -> select -> pack, the groups from stream.py's static or engine stream, scored by
scoring.py; groups.py, pack.py, policy_logps.py) and what a rollout's decode fits (compile_decode.py).
docs/rollout.md.

May import: olmax.fit, olmax.checkpoint, olmax.step, olmax.objectives, olmax.model, olmax.data,
olmax.rewards, olmax.config, olmax.errors.
"""
