"""Checkpoints as named items in Orbax (store.py); warm start, soup and inspect (surgery.py); a
checkpoint's parameters placed for inference (inference.py). docs/checkpoints.md.

May import: olmax.train, olmax.model, olmax.rundir, olmax.config, olmax.extras, olmax.errors.
"""
