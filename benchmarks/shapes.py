"""Model shapes the benchmarks share, as dotted overrides of a recipe: OLMo-core 3.0.0's olmo3_190M and
olmo3_1B (olmo2_1B_v2) layer shapes, and the tiny shape of the benchmarks' dry runs on CPU."""

# OLMo-core 3.0.0 TransformerConfig.olmo3_190M: d_model 768, 12 layers of 12 heads x 64, MLP 3072
SHAPE_190M = [
    "model.d_model=768",
    "model.n_layers=12",
    "model.n_heads=12",
    "model.n_kv_heads=12",
    "model.head_dim=64",
    "model.mlp_hidden=3072",
]
# OLMo-core's olmo3_1B (olmo2_1B_v2): d_model 2048, 16 layers of 16 heads x 128, MLP 8192
SHAPE_1B = [
    "model.d_model=2048",
    "model.n_layers=16",
    "model.n_heads=16",
    "model.n_kv_heads=16",
    "model.head_dim=128",
    "model.mlp_hidden=8192",
]
# A dry run's shape on CPU (the rows keep their layer counts): its figures mean nothing
TINY_SHAPE = [
    "model.d_model=64",
    "model.n_heads=4",
    "model.n_kv_heads=4",
    "model.head_dim=16",
    "model.mlp_hidden=192",
    "model.sliding_window=128",
    "model.max_position=256",
    "data.seq_len=256",
]
