"""The embedded defaults end to end: `olmax demo` (pretrain.py: the tiny model on the shipped corpus)
and `olmax demo chat` (chat.py: SFT, DPO and RL on the shipped chat corpus).

May import: olmax.trainer, olmax.rollout, olmax.checkpoint, olmax.objectives, olmax.model, olmax.data,
olmax.rewards, olmax.rundir, olmax.config.
"""
