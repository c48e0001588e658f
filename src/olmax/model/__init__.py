"""The OLMo 3 model as one device sees it: parameters declared once with their logical axes, the
block and the forward pass (olmo3.py), attention backends (attention.py), RoPE and YaRN (rope.py);
and the device mesh with the ONE table that maps logical axes to mesh axes (sharding.py).

May import: olmax.config, olmax.errors. Never data, objectives, step, fit or checkpoint code.
"""
