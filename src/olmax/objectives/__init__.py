"""What a run minimises, one objective a module behind one interface (base.py): next-token
cross-entropy (lm.py, on OLMo-core's loss in cross_entropy.py), DPO (dpo.py) and GRPO (grpo.py); the
log-probs the objectives on sequences share (logps.py); and which objective trainer.objective names,
built in or an `olmax.objectives` entry point (registry.py). JAX, no host loops: the RL loop's group
selection is olmax.rollout.groups.

May import: olmax.model, olmax.config, olmax.errors.
"""
