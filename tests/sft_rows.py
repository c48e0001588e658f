"""Chat rows for the SFT tests (data packing and the SFT loss): varied conversations and the packed
data config they are read with."""

import numpy as np

from olmax.config.data import DataConfig

SEQ = 256
WORDS = "the cat sat on a mat while seven quiet dogs read old maps near bright rivers".split()


def conversations(n: int, seed: int = 0) -> list[dict]:
    """Chat rows of varied length: one to three user/assistant exchanges, some with a system prompt,
    a few too long for SEQ (truncated by packing) and a few ending with the user (no final EOS)."""
    rng = np.random.default_rng(seed)

    def text(lo, hi):
        return " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi))))

    rows = []
    for i in range(n):
        messages = [{"role": "system", "content": text(1, 6)}] if i % 3 == 0 else []
        for _ in range(int(rng.integers(1, 4))):
            messages += [{"role": "user", "content": text(1, 30)}, {"role": "assistant", "content": text(1, 60)}]
        if i % 7 == 0:
            messages.append({"role": "user", "content": text(1, 5)})
        if i % 11 == 0:
            messages[-1]["content"] = text(200, 300)
        rows.append({"messages": messages})
    return rows


def sft_cfg(sft_dir, work_dir, **kw) -> DataConfig:
    """Packed SFT data (OBFD, document masking, label masks) of the chat files in `sft_dir`."""
    return DataConfig(
        paths=(str(sft_dir),),
        seq_len=SEQ,
        packing="obfd",
        doc_masking=True,
        label_masks=True,
        work_dir=str(work_dir),
        **kw,
    )
