"""Checkpoints between frameworks: HF safetensors <-> olmax with the tokenizer files (hf.py,
hf_tokenizer.py), OLMo-core state dicts and distributed checkpoints into olmax (olmo_core.py), on the
tensors' one table of names and layouts (tensors.py). docs/conversion.md.

May import: olmax.checkpoint, olmax.step, olmax.model, olmax.data, olmax.config, olmax.extras,
olmax.errors.
"""
