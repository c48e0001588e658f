"""What fits where, and how fast: the chip table (chips.py, plain Python), FLOPs and MFU (flops.py),
the real step compiled for a TPU slice or GPU cluster without it (compiler.py), `olmax compile-check`'s
report (compile_check.py), model.remat=auto (remat.py, remat_search.py) and the persistent
compilation cache that keeps compiled programs for the next run (compile_cache.py).

May import: olmax.step, olmax.model, olmax.rundir, olmax.config, olmax.extras, olmax.errors. Never
checkpoint code.
"""
