"""What fits where, and how fast: the chip table (chips.py, plain Python), FLOPs and MFU (flops.py),
the real step compiled for a TPU slice or GPU cluster without it (compiler.py), `olmax compile-check`'s
report (compile_check.py) and model.remat=auto (remat.py, remat_search.py).

May import: olmax.train and the layers below it; never checkpoint code.
"""
