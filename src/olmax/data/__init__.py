"""Tokenization, OLMo-core's instances and data order, the Grain loader, chat data and DPO's preference
pairs (docs/data.md). numpy, no jax, no model.

May import: olmax.config, olmax.extras, olmax.errors. Never the model or jax.
"""
