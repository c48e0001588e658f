"""The SFT parts of the training-parity run (olmax.convert.train_parity, `Setup(sft=True)`): the chat
data and OLMo-core's attention within documents on CPU.

Data: synthetic conversations tokenized by `olmax.data.chat_files.tokenize_chat` (what `olmax tokenize
--chat instruct` runs: the OLMo 3 Instruct template, AI2's label masks, AI2's file layout), then their
ids renumbered onto a vocabulary of VOCAB (EOS kept as the last id) so the tiny model's output layer
stays small: the renumbered parts keep the layout (`token_ids_part_N.npy` in the smallest unsigned
dtype OLMo-core picks for VOCAB, `labels_mask_part_N.npy`, `token_ids_part_N.csv.gz`), which both
sides read, OLMo-core with `label_mask_paths`.

Attention: AI2 ran SFT with flash-attn's varlen kernel (`cu_doc_lens` from the batch's `doc_lens`,
olmo_core/nn/transformer/model.py 3.0.0); flash-attn needs CUDA, and OLMo-core 3.0.0's SDPA backend
(`TorchAttentionBackend`, olmo_core/nn/attention/backend.py) refuses `cu_doc_lens`. `mask_within_documents_`
swaps each block's backend for one that is that SDPA backend plus the varlen kernel's masking: a key is
seen when it is in the query's document and inside the causal window the SDPA backend already builds.
Everything else (RoPE restarted per document from `cu_doc_lens`, the loss) stays OLMo-core's own code.

Ranks (`Setup(ranks=D)`, D > 1): `run_olmo_core_ranks` trains with OLMo-core's own
`TransformerTrainModule` in D processes (torch.distributed, gloo, on CPU; FSDP in fp32), each rank
reading its rows with OLMo-core's loader, so its per-rank loss normalisation is OLMo-core's code too;
olmax runs trainer.loss_normalisation=per_rank with trainer.loss_ranks=D.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = "red blue green gold grey pink black white".split()
# the answer to a word: what the model has to learn, within the conversation it reads
ANSWER = dict(zip(WORDS, "stone river cloud leaf ash rose coal snow".split()))


def conversations(n: int, seed: int = 0) -> list[dict]:
    """Chat rows: one or two user/assistant exchanges, the answer naming ANSWER[w] for each word w the
    user wrote. All but every fifth have a short system prompt (the others get the template's default
    one): ~51 tokens each, so an instance of 128 tokens packs two or three."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        messages = [{"role": "system", "content": "one word per colour"}] if i % 5 else []
        for _ in range(int(rng.integers(1, 3))):
            words = list(rng.choice(WORDS, size=int(rng.integers(1, 8))))
            messages.append({"role": "user", "content": " ".join(words)})
            messages.append({"role": "assistant", "content": " ".join(ANSWER[w] for w in words)})
        rows.append({"messages": messages})
    return rows


def write_chat_corpus(directory: Path, n: int, vocab: int, eos: int, shard_tokens: int = 8000) -> list[str]:
    """`n` conversations through `tokenize_chat` (dolma2, instruct), renumbered onto ids 0..vocab-1 with
    dolma2's EOS as `eos`; returns the token part paths (each with its mask part beside it)."""
    from olmax.data.chat_files import MASKS, METADATA, TOKENS, tokenize_chat
    from olmax.data.tokenizer import Dolma2Tokenizer

    raw = directory / "dolma2"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in conversations(n)))
    manifest = tokenize_chat([raw / "sft.jsonl"], raw / "tokens", "instruct", shard_tokens=shard_tokens)[""]
    info = Dolma2Tokenizer().info
    parts = [np.fromfile(raw / "tokens" / p["path"], dtype=manifest["dtype"]) for p in manifest["shards"]]
    used = np.unique(np.concatenate(parts))
    used = used[used != info.eos_token_id]
    if len(used) > vocab - 3:  # the ids of a tiny vocabulary leave the pad and EOS ids free
        raise ValueError(f"{len(used)} distinct tokens do not fit a vocabulary of {vocab}")
    new_id = dict(zip(used.tolist(), range(len(used))))
    new_id[info.eos_token_id] = eos
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32  # OLMo-core's smallest unsigned dtype
    out = directory / "tokens"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, ids in enumerate(parts):
        np.asarray([new_id[t] for t in ids.tolist()], dtype).tofile(out / TOKENS.format(k))
        for name in (MASKS.format(k), METADATA.format(k)):  # masks and document offsets are unchanged
            (out / name).write_bytes((raw / "tokens" / name).read_bytes())
        paths.append(str(out / TOKENS.format(k)))
    return paths


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

    from olmax.convert.train_parity import Run, olmo_core_dataset

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
            [sys.executable, "-m", "olmax.convert.train_parity_sft", str(spec)],
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

    from olmax.convert.train_parity import PAD, Run, Setup, batch_record, build_olmo_core_model, olmo_core_dataset

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
