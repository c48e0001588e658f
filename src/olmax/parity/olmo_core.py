"""OLMo-core's side of the training-parity run (olmax.parity.training), in ai2-olmo-core 3.0.0's own
code: the tiny OLMo 3 it builds and initialises, its datasets and loader over the run's files, a
hand-written loop that does per step what its TransformerTrainModule does, and (`run_olmo_core_ranks`)
its own train module over several data-parallel ranks in processes of their own.

Attention within documents (SFT): AI2 ran SFT with flash-attn's varlen kernel (`cu_doc_lens` from the
batch's `doc_lens`, olmo_core/nn/transformer/model.py 3.0.0); flash-attn needs CUDA, and OLMo-core
3.0.0's SDPA backend (`TorchAttentionBackend`, olmo_core/nn/attention/backend.py) refuses `cu_doc_lens`.
`mask_within_documents_` swaps each block's backend for one that is that SDPA backend plus the varlen
kernel's masking: a key is seen when it is in the query's document and inside the causal window the
SDPA backend already builds. Everything else (RoPE restarted per document from `cu_doc_lens`, the loss)
stays OLMo-core's own code.

`python -m olmax.parity.olmo_core SPEC` is one rank of `run_olmo_core_ranks`. Needs the `parity` extra."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from olmax.parity.harness import EOS, PAD, PADDED_VOCAB, VOCAB, Run, Setup, batch_record, spike_batch


def build_olmo_core_model(setup: Setup):
    """A tiny OLMo 3 (olmo3_transformer_config) with OLMo-core's own initialisation (fp32, CPU)."""
    import torch

    from olmax.convert.olmo_core import olmo3_transformer_config

    cfg = olmo3_transformer_config(
        d_model=setup.d_model,
        vocab_size=PADDED_VOCAB,
        n_layers=setup.n_layers,
        n_heads=setup.n_heads,
        n_kv_heads=setup.n_kv_heads,
        window=setup.window,
        rope_theta=10000,
    )
    model = cfg.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    if setup.sft:
        from olmax.parity.olmo_core import mask_within_documents_

        mask_within_documents_(model)
    return model


def nudge_(model) -> None:
    """Move every weight by one float32 ulp (towards +inf): a start that differs only by rounding."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))


def olmo_core_dataset(paths: list[str], setup: Setup, work: Path):
    """Stage 1: `NumpyFSLDataset` over the token files. SFT: `NumpyPackedFSLDataset` configured as
    src/scripts/train/sft/Olmo-3-7B-SFT.py (OLMo-core) builds it: the token and mask globs, OBFD,
    truncate, `generate_doc_lengths`."""
    from olmo_core.data import NumpyFSLDatasetConfig, NumpyPackedFSLDatasetConfig, TokenizerConfig
    from olmo_core.data.types import LongDocStrategy

    tok = TokenizerConfig(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=PAD)
    if not setup.sft:
        return NumpyFSLDatasetConfig(
            tokenizer=tok, paths=list(paths), sequence_length=setup.seq_len, work_dir=str(work)
        )
    directory = Path(paths[0]).parent
    return NumpyPackedFSLDatasetConfig(
        tokenizer=tok,
        paths=[f"{directory}/token_ids_part_*.npy"],
        label_mask_paths=[f"{directory}/labels_mask_*.npy"],
        expand_glob=True,
        generate_doc_lengths=True,
        long_doc_strategy=LongDocStrategy.truncate,
        sequence_length=setup.seq_len,
        work_dir=str(work),
    )


def run_olmo_core(model, paths: list[str], setup: Setup, work: Path) -> Run:
    import torch
    from olmo_core.data import DataCollator, NumpyDataLoaderBase
    from olmo_core.data.utils import get_labels
    from olmo_core.optim import CosWithWarmup, LinearWithWarmup, SkipStepAdamW

    ds = olmo_core_dataset(paths, setup, work).build()
    ds.prepare()
    loader = NumpyDataLoaderBase.wrap_numpy_dataset(
        ds,
        global_batch_size=setup.global_batch * setup.seq_len,
        collator=DataCollator(pad_token_id=PAD),
        work_dir=str(work),
        seed=setup.seed,
        dp_world_size=1,
        dp_rank=0,
    )
    loader.reshuffle(epoch=1)
    if loader.total_batches < setup.steps:
        raise ValueError(f"the corpus holds {loader.total_batches} batches, fewer than --steps {setup.steps}")

    embed = [p for n, p in model.named_parameters() if n == "embeddings.weight"]
    rest = [p for n, p in model.named_parameters() if n != "embeddings.weight"]
    opt = SkipStepAdamW(
        [{"params": rest}, {"params": embed, "weight_decay": 0.0}],
        lr=setup.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=setup.weight_decay,
        rolling_interval_length=setup.skip_window,
    )
    if setup.sft:
        sched = LinearWithWarmup(warmup_fraction=0.03, alpha_f=0.0)
    else:
        sched = CosWithWarmup(warmup=setup.warmup, alpha_f=setup.alpha_f)
    params = list(model.parameters())
    run = Run()
    model.train()
    start = time.perf_counter()
    # One thread: a model this small gains nothing from more, and on busy shared cores torch's
    # threads spin and slow it down many times over (docs/training.md).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step, batch in zip(range(1, setup.steps + 1), loader):
            if step == setup.spike_step:
                batch = {"input_ids": torch.from_numpy(spike_batch(setup)).long()}
            run.batches.append(batch_record(batch["input_ids"], batch.get("label_mask"), batch.get("doc_lens")))
            # TransformerTrainModule.train_batch + _prepare_batch (3.0.0): labels from the batch (its
            # label_mask -> -100), the rest of the batch (doc_lens, max_doc_lens, ...) as model kwargs
            labels = get_labels(batch)
            kwargs = {k: v for k, v in batch.items() if k != "input_ids"}
            opt.zero_grad(set_to_none=True)
            out = model(
                batch["input_ids"],
                labels=labels,
                loss_reduction="sum",
                z_loss_multiplier=setup.z_loss or None,
                loss_div_factor=(labels != -100).sum(),
                return_logits=False,
                **kwargs,
            )
            out.loss.backward()
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm)
            lr = sched.get_lr(setup.lr, step, setup.steps)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.latest_loss = out.ce_loss.detach()
            opt.latest_grad_norm = norm
            opt.step()
            run.ce.append(float(out.ce_loss))
            run.z.append(0.0 if out.z_loss is None else float(out.z_loss))
            run.grad_norm.append(float(norm))
            run.lr.append(float(lr))
            if float(opt.step_skipped):
                run.skipped.append(step)
    finally:
        torch.set_num_threads(threads)
    run.seconds = time.perf_counter() - start
    loader.reset()
    return run


def mask_within_documents_(model) -> None:
    """Give every attention block of an OLMo-core model a backend that keeps attention within the
    documents `cu_doc_lens` marks (flash-attn varlen's masking) on top of OLMo-core's SDPA backend."""
    import torch
    import torch.nn.functional as F
    from olmo_core.nn.attention.backend import TorchAttentionBackend, _repeat_kv

    class DocumentSDPA(TorchAttentionBackend):
        # the varlen kernel's other arguments (max_doc_len, ...) only size its blocks
        def forward(self, qkv, cu_doc_lens=None, **unused):
            q, k, v = qkv
            b, t = q.shape[:2]
            # causal, and on the sliding layers the window: the mask OLMo-core's SDPA backend builds
            allowed = self._build_sliding_window_mask(t, t, q.device, self.window_size)[None]
            if cu_doc_lens is not None:
                # the document of every position of the flattened batch, as olmo_core/nn/rope.py finds it
                flat = torch.arange(b * t, device=q.device, dtype=cu_doc_lens.dtype)
                doc = torch.bucketize(flat, cu_doc_lens[1:], right=True).view(b, t)
                allowed = allowed & (doc[:, :, None] == doc[:, None, :])
            rep = self.n_heads // self.n_kv_heads
            k, v = _repeat_kv(k, rep), _repeat_kv(v, rep)  # the SDPA backend's GQA
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                attn_mask=allowed[:, None],
                scale=self.scale,
            )
            return out.transpose(1, 2).contiguous()

    for block in model.blocks.values():
        block.attention.backend.__class__ = DocumentSDPA


def run_olmo_core_ranks(state_dict_path: Path, paths: list[str], setup, work: Path):
    """OLMo-core's own `TransformerTrainModule` over `setup.ranks` data-parallel ranks: one process per
    rank (torch.distributed, gloo, on CPU), each reading its rank's rows with OLMo-core's loader
    (`dp_rank`, `dp_world_size`), the model under FSDP, `train_batch` + `optim_step` per step as
    OLMo-core's `Trainer` calls them. -> (Run, final state dict): the CE the train module records (the
    ranks' mean, what SkipStepAdamW watches), the grad norm and the learning rate from rank 0, and the
    global batches reassembled from the ranks' rows (rank r holds rows r, r + ranks, ...)."""
    import os
    import socket
    import subprocess
    import sys

    import torch

    from olmax.parity.harness import Run
    from olmax.parity.olmo_core import olmo_core_dataset

    ds = olmo_core_dataset(paths, setup, work / "data")  # packed once here, read by every rank
    ds.build().prepare()
    with socket.socket() as s:  # a free port for the ranks' rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(setup.ranks)}
    spec = work / "spec.json"
    spec.write_text(json.dumps({"state_dict": str(state_dict_path), "paths": paths, "setup": setup.__dict__}))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "olmax.parity.olmo_core", str(spec)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(setup.ranks)
    ]
    logs = [p.communicate()[0] for p in procs]
    for r, (p, log) in enumerate(zip(procs, logs)):
        if p.returncode:
            raise RuntimeError(f"OLMo-core rank {r} failed (exit {p.returncode}):\n{log[-4000:]}")
    out = [torch.load(work / f"rank{r}.pt", weights_only=False) for r in range(setup.ranks)]
    run = Run(**{k: out[0][k] for k in ("ce", "z", "grad_norm", "lr", "skipped", "seconds")})
    for step in range(setup.steps):  # rank r's k-th row is row k * ranks + r of the global batch
        parts = [o["batches"][step] for o in out]
        run.batches.append(
            {k: np.stack([p[k] for p in parts], axis=1).reshape(-1, *parts[0][k].shape[1:]) for k in parts[0]}
        )
    return run, out[0]["state_dict"]


def _rank_main(spec_path: str) -> None:
    """One rank of `run_olmo_core_ranks` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment)."""
    import time

    import torch
    import torch.distributed as dist
    from olmo_core.data import DataCollator, NumpyDataLoaderBase
    from olmo_core.distributed.parallel import DataParallelType
    from olmo_core.optim import LinearWithWarmup, SkipStepAdamWConfig
    from olmo_core.train.train_module import TransformerDataParallelConfig, TransformerTrainModule

    from olmax.parity.harness import PAD, Run, Setup, batch_record
    from olmax.parity.olmo_core import build_olmo_core_model, olmo_core_dataset

    spec = json.loads(Path(spec_path).read_text())
    setup = Setup(**spec["setup"])
    work = Path(spec_path).parent
    torch.set_num_threads(1)  # one core per rank
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    model = build_olmo_core_model(setup)
    model.load_state_dict(torch.load(spec["state_dict"]))

    class Recorder:  # what TransformerTrainModule asks of OLMo-core's Trainer in train_batch / optim_step
        def __init__(self):
            self.global_step, self.max_steps, self.metrics = 0, setup.steps, {}

        def record_metric(self, name, value, reduce_type=None, namespace=None, merge_strategy=None):
            self.metrics[name] = value

        def record_ce_loss(self, value, reduce_type=None):
            self.metrics["CE loss"] = value

    module = TransformerTrainModule(
        model,
        SkipStepAdamWConfig(
            lr=setup.lr, betas=(0.9, 0.95), weight_decay=0.0, rolling_interval_length=setup.skip_window
        ),
        rank_microbatch_size=setup.rank_micro_batch * setup.seq_len,
        max_sequence_length=setup.seq_len,
        dp_config=TransformerDataParallelConfig(name=DataParallelType.fsdp),
        max_grad_norm=1.0,
        scheduler=LinearWithWarmup(warmup_fraction=0.03, alpha_f=0.0),
        device=torch.device("cpu"),
    )
    trainer = Recorder()
    module._attach_trainer(trainer)
    loader = NumpyDataLoaderBase.wrap_numpy_dataset(
        olmo_core_dataset(spec["paths"], setup, work / "data").build(),
        global_batch_size=setup.global_batch * setup.seq_len,
        collator=DataCollator(pad_token_id=PAD),
        work_dir=str(work / "data"),
        seed=setup.seed,
        dp_world_size=ranks,
        dp_rank=rank,
    )
    loader.reshuffle(epoch=1)
    run = Run()
    start = time.perf_counter()
    module.zero_grads()
    for step, batch in zip(range(1, setup.steps + 1), loader):
        trainer.global_step = step
        run.batches.append(batch_record(batch["input_ids"], batch["label_mask"], batch["doc_lens"]))
        module.train_batch(batch)
        module.optim_step()
        module.zero_grads()
        m = trainer.metrics
        run.ce.append(float(m["CE loss"]))
        run.z.append(0.0)
        run.grad_norm.append(float(m["total grad norm"]))
        run.lr.append(float(m["LR (group 0)"]))
        if float(m["step skipped"]):
            run.skipped.append(step)
    run.seconds = time.perf_counter() - start
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in module.model.state_dict().items()}
    torch.save({**run.__dict__, "state_dict": state}, work / f"rank{rank}.pt")
    loader.reset()
    dist.destroy_process_group()


if __name__ == "__main__":
    import sys

    _rank_main(sys.argv[1])
