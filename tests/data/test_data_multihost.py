"""Two JAX processes (jax.distributed on 127.0.0.1), each loading only its ranks' rows: the global
batches they assemble hold every instance of the epoch exactly once, in OLMo-core's rows."""

from __future__ import annotations

import json
import textwrap

import numpy as np
from multihost import run_processes

WORKER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from olmax.config.data import DataConfig
    from olmax.data.loader import make_loader

    port, pid, paths, work, out = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4], sys.argv[5]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    mesh = Mesh(np.array(jax.devices()), ("data",))   # 2 processes x 2 devices = 4 data-parallel ranks
    dp = mesh.size
    local = jax.local_device_count()
    first_rank = min(list(mesh.devices.flat).index(d) for d in jax.local_devices())
    cfg = DataConfig(paths=tuple(paths), seq_len=32, seed=5, vocab_size=5000, eos_token_id=4999, pad_token_id=0,
                     work_dir=work)
    loader = make_loader(cfg, 8, dp_rank=first_rank, dp_size=dp, local_ranks=local)
    sharding = NamedSharding(mesh, P("data"))
    batches = []
    it = iter(loader)
    for _ in range(loader.batches_per_epoch):
        batch = next(it)
        ids = jax.make_array_from_process_local_data(sharding, batch["index"].astype(np.int32))
        tokens = jax.make_array_from_process_local_data(sharding, batch["input_ids"])
        batches.append([np.asarray(multihost_utils.process_allgather(ids, tiled=True)).tolist(),
                        int(np.asarray(multihost_utils.process_allgather(tokens, tiled=True)).sum())])
    if pid == 0:
        json.dump({"batches": batches, "n": len(loader.source)}, open(out, "w"))
    jax.distributed.shutdown()
""")


def test_two_processes_deliver_each_instance_once(tmp_path):
    rng = np.random.default_rng(0)
    paths = []
    for i, n in enumerate((1000, 333, 2048, 777)):
        p = tmp_path / f"{i:06d}.npy"
        rng.integers(0, 5000, size=n).astype(np.uint16).tofile(p)
        paths.append(str(p))
    out = tmp_path / "out.json"
    run_processes(WORKER, tmp_path, lambda pid: [",".join(paths), str(tmp_path / f"cache{pid}"), str(out)])

    result = json.loads(out.read_text())
    from olmax.data.order import permutation
    from olmax.data.sources import TokenSource
    from olmax.data.tokenizer import TokenizerFields

    source = TokenSource(paths, 32, TokenizerFields(5000, 4999, 0))
    order = permutation(result["n"], 5, 1)
    seen = []
    for b, (ids, token_sum) in enumerate(result["batches"]):
        row = order[b * 8 : (b + 1) * 8]
        # the global array holds rank 0's rows, then rank 1's, ... (columns r::4 of OLMo-core's row)
        assert ids == [int(row[r + 4 * j]) for r in range(4) for j in range(2)]
        assert token_sum == int(sum(source[int(i)].astype(np.int64).sum() for i in ids))
        seen.extend(ids)
    assert len(seen) == len(set(seen)) == (result["n"] // 8) * 8
