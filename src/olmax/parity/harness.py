"""The training-parity run's common ground (olmax.parity.training): its settings (Setup), what each
side records (Run), and the token files both sides read: a Markov corpus with a spike batch, or in
SFT the chat parts of olmax.parity.sft."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Corpus: a Markov chain over the first CORPUS_TOKENS ids (so the loss falls quickly), documents
# ended by EOS; ids CORPUS_TOKENS..PAD-1 never occur and make the spike batch. The model's
# embedding has PADDED_VOCAB rows, as AI2 builds OLMo 3 with the padded vocabulary (docs/reference.md, "Model").
VOCAB, EOS, PAD = 300, 299, 298
PADDED_VOCAB = 384
CORPUS_TOKENS = 200


@dataclass(frozen=True)
class Setup:
    steps: int = 100
    spike_step: int = 80  # > skip_window / 2: the skip rule needs half of its window first
    seq_len: int = 32
    global_batch: int = 8
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    window: int = 8
    lr: float = 3e-3
    warmup: int = 10
    alpha_f: float = 0.1
    skip_window: int = 128  # AI2's; a short test run shrinks it on both sides so the rule can fire early
    seed: int = 34521  # data order seed
    sft: bool = False  # SFT as AI2 ran it (the module doc) instead of stage-1 pre-training
    # SFT over several data-parallel ranks: OLMo-core's train module in one process per rank, olmax
    # with trainer.loss_normalisation=per_rank over as many ranks (the module doc)
    ranks: int = 1
    micro_batch: int = 0  # instances per OLMo-core rank per forward/backward with ranks > 1; 0 = all

    def __post_init__(self):
        if self.sft and self.spike_step:
            raise ValueError("the spike batch is pre-training data: Setup(sft=True) takes spike_step=0")
        if self.ranks > 1 and not self.sft:
            raise ValueError("Setup(ranks > 1) is the SFT run (per-rank loss normalisation): it needs sft=True")

    @classmethod
    def sft_run(cls, steps: int, **kw) -> "Setup":
        """SFT's setup: instances of 128 tokens (two or three conversations), no spike, lr 1e-3.
        At 3e-3 this data trains at the edge of stability (the CE stalls near 2.2 and the gradient norm
        swings), where float32 rounding grows past 1e-4 of the CE within 40 steps: OLMo-core against
        itself from a start one ulp away as much as olmax against it (docs/post-training/sft-parity.md)."""
        return cls(steps=steps, spike_step=0, seq_len=128, lr=1e-3, sft=True, **kw)

    @property
    def rank_micro_batch(self) -> int:
        return self.micro_batch or self.global_batch // self.ranks

    @property
    def z_loss(self) -> float:
        return 0.0 if self.sft else 1e-5

    @property
    def weight_decay(self) -> float:
        return 0.0 if self.sft else 0.1


@dataclass
class Run:
    ce: list = field(default_factory=list)
    z: list = field(default_factory=list)
    grad_norm: list = field(default_factory=list)
    lr: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # 1-based steps the optimizer skipped
    batches: list = field(default_factory=list)  # per step {input_ids[, label_mask, doc]} (to prove the same data)
    params: dict | None = None  # final parameters, olmax layout, numpy
    seconds: float = 0.0


def write_corpus(directory: Path, n_files: int = 3, tokens_per_file: int = 40_000, seed: int = 0) -> list[str]:
    """Raw uint16 token files (OLMo-core's format: headerless, EOS after each document)."""
    rng = np.random.default_rng(seed)
    successor = rng.permutation(CORPUS_TOKENS)  # the likely next token of each token
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(n_files):
        out = []
        while len(out) < tokens_per_file:
            n = int(rng.integers(20, 200))
            doc = [int(rng.integers(CORPUS_TOKENS))]
            follow = rng.random(n) < 0.8
            noise = rng.integers(CORPUS_TOKENS, size=n)
            for i in range(n - 1):
                doc.append(int(successor[doc[-1]]) if follow[i] else int(noise[i]))
            out += doc + [EOS]
        path = directory / f"part-{f:03d}.npy"
        np.asarray(out[:tokens_per_file], np.uint16).tofile(path)
        paths.append(str(path))
    return paths


def write_data(setup: Setup, directory: Path) -> list[str]:
    """The token files the run reads: the Markov corpus over 3 files, a tenth more than the run consumes
    (remainders are dropped per file); in SFT, conversations of ~51 tokens, one per 40 tokens the run
    consumes (OBFD pads ~10% of every instance)."""
    tokens = 1.1 * setup.steps * setup.global_batch * setup.seq_len
    if setup.sft:
        from olmax.parity.sft import write_chat_corpus

        return write_chat_corpus(directory, n=int(tokens / 40), vocab=VOCAB, eos=EOS)
    return write_corpus(directory, tokens_per_file=max(40_000, int(tokens / 3) + 3 * setup.seq_len))


def spike_batch(setup: Setup) -> np.ndarray:
    """Tokens the corpus never contains: the model has learned to push their logits down."""
    rng = np.random.default_rng(1)
    return rng.integers(CORPUS_TOKENS, PAD, size=(setup.global_batch, setup.seq_len)).astype(np.int32)


def batch_record(input_ids, label_mask=None, doc_lens=None) -> dict:
    """What a step trained on, comparable across the two loaders: the tokens, and in SFT the label
    mask and each token's document (doc_lens rows are padded with zeros to different widths)."""
    out = {"input_ids": np.asarray(input_ids, np.int32)}
    if label_mask is not None:
        out["label_mask"] = np.asarray(label_mask, bool)
        out["doc"] = np.stack([np.repeat(np.arange(len(row)), row) for row in np.asarray(doc_lens)])
    return out
