"""The remat sets the fit tests expect, spelled out here rather than read from olmax.config.remat (a
test's expectation does not come from the code it checks)."""

from olmax.config.remat import REMAT_TAGS

# What the MaxText OLMo 3 run kept (its write-up), in the block's order; the same but the MLP's gate;
# every matmul output (nothing recomputed): the first three sets of model.remat=auto's ladder
SEEDS_SET = ["q_proj", "k_proj", "v_proj", "attn_context", "o_proj", "mlp_gate", "mlp_down"]
SEEDS_BUT_GATE = [t for t in SEEDS_SET if t != "mlp_gate"]
EVERY_MATMUL = [t for t in REMAT_TAGS if t != "layer_input"]
