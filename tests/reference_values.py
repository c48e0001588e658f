"""Check values from the upstream sources (docs/reference.md) that several test files compare against."""

# AI2's stage-1 learning rate at 1-based steps, both parts of its schedule (docs/reference.md,
# "Recipe and schedules"): -pretrain-1.py's cosine up to step 596,047, then -pretrain-2.py's
# HalfCosWithWarmup(warmup 597,046), on its warmup ramp from 596,048 to 597,045.
STAGE1_LR = [
    (1, 1.5e-7),
    (1000, 1.5e-4),
    (1999, 2.9985e-4),
    (2000, 3e-4),
    (596_047, 1.6535619e-4),
    (596_048, 1.6472419e-4),
    (597_045, 1.6499972e-4),
    (597_046, 1.65e-4),
    (597_047, 1.6499980e-4),
    (600_000, 1.6441559e-4),
    (1_000_000, 8.9834077e-5),
    (1_668_931, 3e-5),
]

# That schedule's settings (docs/reference.md): the cosine to 5e12 tokens, switched at step 596,048 to
# HalfCosWithWarmup(warmup 597,046) to 7e12 tokens; warmup 2000 steps, alpha_f 0.1.
STAGE1_SETTINGS = {
    "name": "stitched_cosine",
    "warmup_steps": 2000,
    "alpha_f": 0.1,
    "t_max_tokens": 5 * 10**12,
    "switch_step": 596_048,
    "half_cos_warmup": 597_046,
    "final_t_max_tokens": 7 * 10**12,
}
