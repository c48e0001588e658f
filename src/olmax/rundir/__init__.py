"""A run directory, read and written without jax: its small files, local or gs:// (paths.py), the
exit record a trainer leaves (exits.py), and how far the run goes and where its checkpoints are
(progress.py). The trainer writes these; the launcher and `olmax status` read them.

May import: olmax.config, olmax.extras, olmax.errors.
"""
