"""MaxText 0.2.5's own train step, AOT-compiled for a TPU slice on this CPU host: the `maxtext` rows of
`benchmarks/compile.py --remat-sweep`. Runs in the MaxText venv (benchmarks/maxtext_venv.sh: Python
>= 3.12, jax 0.12), so it imports nothing from olmax; compile.py passes the chip's flags.

    $MAXTEXT_PYTHON benchmarks/maxtext_compile.py --topology tpu7x-128 --per-device-batch 4 \
        --save query_proj,key_proj,value_proj --flags "--xla_tpu_scoped_vmem_limit_kib=65536 ..." \
        --json out.json [--model olmo3-7b-pt --set head_dim=256 ...]

It calls MaxText's `train_compile` entry with the OLMo 3 model, fp32 weights, bf16 compute, splash
attention (tokamax's, blocks of 2048), pure FSDP and synthetic data, and the remat policy `custom`
keeping the named tensors on the device (`--save ''`: `full`). It writes the compiler's heap: on
jax 0.12 `memory_analysis().total_allocation_bytes`, the buffer assignment's total, which is what
the TPU compiler checks against HBM; over the limit the compile fails with an out-of-memory error,
reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

GIB = 2**30
# MaxText's names (configs/base.yml, `custom` remat) of the tensors olmax tags (olmax.config.remat.REMAT_TAGS)
MAXTEXT_TENSORS = ("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")


def argv_for(args, base_yml: str) -> list[str]:
    save = [t for t in args.save.split(",") if t]
    unknown = [t for t in save if t not in MAXTEXT_TENSORS]
    if unknown:
        raise SystemExit(f"unknown MaxText remat tensor(s) {unknown}; known: {', '.join(MAXTEXT_TENSORS)}")
    remat = ["remat_policy=full"]
    if save:
        remat = ["remat_policy=custom"] + [f"{t}={'device' if t in save else 'remat'}" for t in MAXTEXT_TENSORS]
    blocks = [f"sa_block_{n}=2048" for n in ("q", "kv", "q_dkv", "kv_dkv", "q_dq", "kv_dq")]
    blocks += [f"sa_block_{n}=1024" for n in ("kv_compute", "kv_dkv_compute")]
    return [
        "train_compile",
        base_yml,
        f"model_name={args.model}",
        f"compile_topology={args.topology}",
        "compile_topology_num_slices=1",
        f"per_device_batch_size={args.per_device_batch}",
        # micro-batches per step, each of per_device_batch_size rows per device (MaxText's pyconfig
        # multiplies the global batch by it), as olmax's trainer.micro_batch_size splits a step
        f"gradient_accumulation_steps={args.accumulation}",
        f"max_target_length={args.seq_len}",
        "weight_dtype=float32",
        "dtype=bfloat16",
        "ici_fsdp_parallelism=-1",
        "dataset_type=synthetic",
        "enable_checkpointing=False",
        "attention=flash",
        "use_tokamax_splash=True",
        *blocks,
        f"compile_xla_flags={args.flags}",
        *remat,
        *(["override_model_config=True"] + args.set if args.set else []),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", required=True, help="MaxText's name of the slice: tpu7x-128, v5p-128, ...")
    p.add_argument("--model", default="olmo3-7b-pt")
    p.add_argument("--per-device-batch", type=int, default=4, help="rows per device in one micro-batch")
    p.add_argument("--accumulation", type=int, default=1, help="micro-batches per step (gradient accumulation)")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--save", default="", help="comma-separated MaxText tensors kept on the device ('' = full)")
    p.add_argument("--flags", default="", help="the chip's libtpu flags, as one string")
    p.add_argument("--set", action="append", default=[], help="a MaxText model override, e.g. head_dim=256")
    p.add_argument("--json", required=True)
    args = p.parse_args()

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("DECOUPLE_GCLOUD", "TRUE")
    # jax 0.12.0.1 attaches Mosaic kernels' debug locations in a form neither libtpu 0.0.50.1 nor
    # 0.0.51 reads ("no such field: 'debug_locations'"); with this off, 0.0.51 compiles the splash kernels
    os.environ.setdefault("JAX_MOSAIC_UNZIP_DEBUG_LOCATIONS", "false")
    # with JAX_PLATFORMS=cpu jax cannot ask libtpu which Mosaic version it reads and serialises the
    # kernels in its newest ("unknown attribute code: 23"); MaxText loads the TPU plugin itself
    # and what the caller's jax (olmax's 0.10.2) left: TPU_LIBRARY_PATH would load the caller's libtpu
    # (0.0.42.1: "unknown attribute code" in jax 0.12's kernels) instead of this venv's
    for inherited in (
        "JAX_PLATFORMS",
        "TPU_LIBRARY_PATH",
        "TPU_ML_PLATFORM",
        "TPU_ML_PLATFORM_VERSION",
        "LIBTPU_INIT_ARGS",
    ):
        os.environ.pop(inherited, None)
    import absl.flags
    import maxtext
    from maxtext.trainers.pre_train import train_compile

    absl.flags.FLAGS(["train_compile"])  # main() runs outside absl.app.run
    compiled = []
    original = train_compile.jit_and_compile

    def keep(*a, **k):  # main() prints the memory analysis but returns nothing: keep the object
        compiled.append(original(*a, **k))
        return compiled[-1]

    train_compile.jit_and_compile = keep
    base_yml = str(Path(maxtext.__file__).parent / "configs" / "base.yml")
    row = {"framework": "maxtext", "topology": args.topology, "save": args.save, "model": args.model, "set": args.set}
    t0 = time.perf_counter()
    try:
        train_compile.main(argv_for(args, base_yml))
    except Exception as e:  # the compiler's own words: an HBM out-of-memory is a result, not a failure
        text = str(e)
        row["error"] = text.splitlines()[0][:400] if text else type(e).__name__
        row["oom"] = "RESOURCE_EXHAUSTED" in text or "memory space hbm" in text or "HbmOom" in text
    row["compile_s"] = time.perf_counter() - t0
    if compiled:
        mem = compiled[-1].memory_analysis()
        row["heap_gib"] = mem.total_allocation_bytes / GIB
        row["peak_gib"] = mem.peak_memory_in_bytes / GIB
        row["oom"] = False
    Path(args.json).write_text(json.dumps(row, indent=2))
    print(json.dumps(row))


if __name__ == "__main__":
    sys.exit(main())
