"""Checkpoints as named items in Orbax (store.py); warm start, soup and inspect (surgery.py); a
checkpoint's parameters placed for inference (inference.py). docs/checkpoints.md.

May import: olmax.step, olmax.model, olmax.config, olmax.errors.
"""
