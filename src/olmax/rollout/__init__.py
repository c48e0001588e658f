"""Sampling from the model: the ring-buffer KV cache (cache.py), the one jitted sampler for `olmax
generate`, lm-eval and RL (sampler.py), text in / text out (text.py), the RL loop's rollout batches
(batches.py, pack.py) and what a rollout's decode fits (compile_decode.py). docs/rollout.md.

May import: olmax.fit, olmax.checkpoint, olmax.train and the layers below them.
"""
