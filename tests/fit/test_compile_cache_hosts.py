"""A run on two hosts, simulated by two JAX processes on the CPU (tests/multihost.py), each with a
compilation cache folder of its own, as hosts have. model.remat=auto takes process 0's record on every
process, so that in a new run directory none searches again (olmax.fit.remat.choose_for_devices; a
v5p's budget and a counting compiler stand in for the chip's); and the entries JAX writes on process 0
alone reach process 1's folder, whole, through olmax.fit.compile_cache.share_with_hosts.

That process 1 then reads them back is not shown here: on the CPU, JAX's cache key differs between the
processes of one run (XLA's CPU topology fingerprint, in jax/_src/cache_key.py's accelerator_config, is
each process's own), as it does not on a TPU slice, where jax_share_binary_between_hosts relies on
every process computing process 0's key. The folders' paths differ here too, and JAX puts the path in
the key (the GPU autotuning cache's folder, in the compile options): hosts must name the same path."""

import json
import textwrap

from multihost import run_processes
from small_run import SMALL

WORKER = textwrap.dedent("""
    import json, os, sys, types
    port, pid, cache, run_dir, out, overrides = sys.argv[1:7]
    pid = int(pid)
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # the suite's: each host has its own folder here
    os.environ["OLMAX_COMPILE_CACHE"] = cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # these programs compile in under a second
    from olmax.fit import compile_cache
    compile_cache.enable()
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: hits.append(1) if event == "/jax/compilation_cache/cache_hits" else None)

    from olmax.config.io import apply_overrides
    from olmax.config.recipes import get_recipe
    from olmax.fit import chips, remat
    from olmax.fit.compiler import CompileResult
    from olmax.model.sharding import make_mesh
    searched = []
    def compile_step(cfg, mesh, options, where):  # every candidate fits in 1 GiB
        searched.append(cfg.model.remat)
        memory = types.SimpleNamespace(peak_memory_in_bytes=2**30)
        return CompileResult(types.SimpleNamespace(memory_analysis=lambda: memory), 0.0, 0.0, None)
    remat.compile_step = compile_step
    remat.chip_of_device = lambda device: chips.CHIPS["v5p"]
    cfg = apply_overrides(get_recipe("tiny"), json.loads(overrides))
    mesh = make_mesh(cfg.mesh)
    choice = remat.choose_for_devices(cfg, mesh, run_dir)

    # a program over both processes' devices, as the train step is, compiled by every process
    sharding = NamedSharding(mesh, P(("data", "fsdp")))
    x = jax.make_array_from_process_local_data(sharding, np.ones((2, 16), np.float32) * (pid + 1))
    total = float(jax.jit(lambda x: jnp.sum(jnp.tanh(x) @ x.T))(x))
    hits_before = len(hits)
    written = compile_cache.share_with_hosts()  # where the trainer calls it: the first step's programs compiled
    compile_cache.CHUNK_BYTES = 8  # bytes sent in pieces: 21 bytes in three
    echoed = compile_cache.broadcast_bytes(b"sent by process zero." if pid == 0 else None).decode()
    json.dump({"searched": searched, "remat": choice.cfg.model.remat, "hits": hits_before, "written": written,
               "entries": sorted(n for n in os.listdir(cache) if n.endswith("-cache")), "total": total,
               "echoed": echoed},
              open(out, "w"))
    jax.distributed.shutdown()
""")


def run(tmp_path, name: str) -> list[dict]:
    overrides = json.dumps([*SMALL, "model.remat=auto"])
    outs = [tmp_path / f"{name}-{pid}.json" for pid in range(2)]

    def args(pid):
        return [str(tmp_path / f"cache{pid}"), str(tmp_path / name), str(outs[pid]), overrides]

    run_processes(WORKER, tmp_path, args)
    return [json.loads(out.read_text()) for out in outs]


def test_process_0_s_record_and_entries_reach_every_host(tmp_path):
    cold = run(tmp_path, "first")
    assert [len(r["searched"]) for r in cold] == [1, 1]  # both searched: one compile, the most kept set fits
    assert cold[0]["remat"] == cold[1]["remat"] != "auto" and cold[0]["total"] == cold[1]["total"]
    program = [e for e in cold[0]["entries"] if e.startswith("jit__lambda")]
    assert len(program) == 1 and cold[0]["written"] == []
    assert [r["echoed"] for r in cold] == ["sent by process zero."] * 2
    # JAX wrote on process 0 alone; process 1 got every entry process 0 used, whole, with its -atime file
    assert set(cold[1]["written"]) == set(cold[1]["entries"]) and set(program) <= set(cold[1]["written"])
    for name in cold[1]["written"]:
        assert (tmp_path / "cache1" / name).read_bytes() == (tmp_path / "cache0" / name).read_bytes()
        assert (tmp_path / "cache1" / name.replace("-cache", "-atime")).exists()

    warm = run(tmp_path, "second")  # a new run directory: the record is in process 0's cache folder
    assert [r["searched"] for r in warm] == [[], []]
    assert [r["remat"] for r in warm] == [cold[0]["remat"]] * 2
    assert warm[0]["hits"] >= 1 and [r["written"] for r in warm] == [[], []]  # nothing sent twice
