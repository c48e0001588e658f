"""A run directory, read and written without jax: its small files, local or gs:// (paths.py), the
exit record a trainer leaves (exits.py), how far the run goes and where its checkpoints are
(progress.py), and `olmax status`'s report of it all (report.py). The trainer writes these; the launcher
and `olmax status` read them.

May import: olmax.config, olmax.extras, olmax.errors. Plain Python: no jax.
"""
