"""The `data` section: the training data, the tokenizer ids that enter OLMo-core's data fingerprint,
packing, label masks and the data order's seed (docs/data.md); olmax.data reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from olmax.errors import ConfigError, check_non_negative, check_positive

# olmax's chat templates by name (`olmax tokenize --chat NAME`, grpo.template): the files
# olmax/data/chat_templates/olmo3_NAME.jinja (olmax.data.chat renders them).
CHAT_TEMPLATES = ("instruct", "think", "think_dpo_rl")


@dataclass(frozen=True)
class DataConfig:
    """Training data (docs/data.md). The tokenizer fields enter OLMo-core's data fingerprint."""

    paths: tuple[str, ...] = ()
    """Training data: token shards (local, gs://, http(s)://), globs, `olmax tokenize` output dirs,
    OLMo-core mix files (*.txt), local jsonl text (*.jsonl, *.jsonl.gz, *.jsonl.zst with a `text` field;
    tokenized with data.tokenizer into data.work_dir on first use), or the shipped demo corpus "demo"
    (train split) / "demo:heldout"."""
    seq_len: int = 8192
    """Tokens per training instance."""
    max_target_seq_len: Optional[int] = None
    """OLMo-core's max_target_sequence_length (a multiple of seq_len, or None); AI2's OLMo 3 stage-1 run
    used 8192. It changes instance counts, the order's chunking and the fingerprint."""
    seed: int = 34521
    """Seed of the data order: epoch e is shuffled with PCG64(seed + e), as OLMo-core."""
    tokenizer: str = "dolma2"
    """Tokenizer that jsonl text in data.paths and eval.data is tokenized with: "dolma2" or a tokenizer.json
    path (its ids must match vocab_size and the token ids below)."""
    vocab_size: int = 100278
    """The tokenizer's vocabulary (not the padded embedding): picks the shards' dtype, bounds the token
    check, enters the fingerprint."""
    eos_token_id: int = 100257
    """End-of-document token (dolma2's); enters the fingerprint."""
    pad_token_id: int = 100277
    """Padding token (dolma2's); enters the fingerprint, and is masked from the loss with mask_pad_token."""
    bos_token_id: Optional[int] = None
    """Beginning-of-document token, None for dolma2; enters the fingerprint."""
    mix_base: Optional[str] = None
    """Base that mix-file paths are joined to: a local dir, gs:// or http(s)://."""
    mix_tokenizer_dir: str = "allenai/dolma3-tokenizer"
    """What {TOKENIZER} becomes in mix-file paths."""
    work_dir: str = ""
    """Cache of order memmaps and tokenized text (demo, jsonl in data.paths and eval.data); "" = $OLMAX_CACHE
    or ~/.cache/olmax."""
    mask_pad_token: bool = False
    """Leave pad-token labels out of the loss. OLMo-core does not; the MaxText stage-2 run did."""
    instance_filter: bool = False
    """Mask instances with a long n-gram repetition out of the loss (docs/data.md); off in AI2's official run."""
    num_workers: int = 0
    """Grain worker processes for the loader (0: in the training process); the order does not depend on it."""
    packing: str = "none"
    """How instances are cut: "none" (each file concatenated and chunked, OLMo-core's NumpyFSLDataset) or
    "obfd" (whole documents packed by best-fit decreasing and padded, NumpyPackedFSLDataset; docs/data.md)."""
    source_group_size: int = 1
    """obfd: files packed together as one stream, in consecutive groups of this many (AI2's stage 3: 8)."""
    source_permutation_seed: Optional[int] = None
    """Shuffle the file order with Python's random.Random(seed) before anything else (AI2's stage 3: 123)."""
    long_doc_strategy: str = "truncate"
    """obfd: a document longer than seq_len keeps its first seq_len tokens ("truncate") or is cut into
    pieces ("fragment")."""
    doc_masking: bool = False
    """Send each instance's document lengths with the batch (OLMo-core's generate_doc_lengths); either
    packing. Training keeps attention within each document (docs/attention.md); `olmax data order` shows them."""
    label_masks: bool = False
    """obfd, SFT data: read `labels_mask_part_N.npy` beside each `token_ids_part_N.npy` (AI2's layout,
    `olmax tokenize --chat`) and train only on the tokens it marks (OLMo-core's label_mask_paths)."""
    use_array_if_local: Optional[bool] = None
    """obfd: where a local file's document boundaries come from, as OLMo-core 3.0.0's option of this name:
    null or true scan it for EOS; false reads the `.csv.gz` beside it (a URL always does). Chat parts whose
    manifest counts conversations `without_final_eos` or with `eos_inside` need false (docs/data.md, "Chat
    parts"); set on both sides it enters the fingerprint."""

    def __post_init__(self):
        check_positive("data", self, "seq_len", "vocab_size")
        check_non_negative("data", self, "num_workers")
        self._check_packing()
        target = self.max_target_seq_len
        if target is not None and (target < self.seq_len or target % self.seq_len):
            raise ConfigError(
                f"data.max_target_seq_len={target} must be a multiple of data.seq_len={self.seq_len} (or null)"
            )

    def _check_packing(self) -> None:
        if self.packing not in ("none", "obfd"):
            raise ConfigError(f"data.packing must be none or obfd, got {self.packing!r}")
        if self.long_doc_strategy not in ("truncate", "fragment"):
            raise ConfigError(f"data.long_doc_strategy must be truncate or fragment, got {self.long_doc_strategy!r}")
        if not isinstance(self.source_group_size, int) or self.source_group_size < 1:
            raise ConfigError(f"data.source_group_size must be a positive integer, got {self.source_group_size!r}")
        if self.packing == "none":
            only_packed = (
                ("source_group_size", 1),
                ("long_doc_strategy", "truncate"),
                ("label_masks", False),
                ("use_array_if_local", None),
            )
            for name, default in only_packed:
                if getattr(self, name) != default:
                    raise ConfigError(f"data.{name} applies to packed documents only: set data.packing=obfd")
        elif self.max_target_seq_len is not None:
            raise ConfigError(
                "data.max_target_seq_len does not apply with data.packing=obfd (packed instances are whole "
                "documents, OLMo-core's NumpyPackedFSLDataset has no such field): set it to null"
            )
        # OLMo-core 3.0.0 asserts this in its OBFD packer (olmo_core/data/utils.py, SegmentTree); any
        # other length has no OLMo-core result for olmax to match.
        if self.packing == "obfd" and self.seq_len & (self.seq_len - 1):
            raise ConfigError(
                f"data.seq_len={self.seq_len} with data.packing=obfd must be a power of 2 (OLMo-core 3.0.0's "
                "OBFD packer asserts it)"
            )
