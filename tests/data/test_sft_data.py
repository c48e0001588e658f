"""SFT data: files written by `olmax tokenize --chat`, packed with their label masks (data.label_masks),
against ai2-olmo-core 3.0.0's NumpyPackedFSLDataset with `label_mask_paths`; the batch's `label_mask`
and `olmax data order --with-tokens`; the CLI's own output read both ways (EOS scanning, `.csv.gz`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sft_rows import SEQ, conversations, sft_cfg
from typer.testing import CliRunner

from olmax.cli.common import app
from olmax.config.data import DataConfig
from olmax.data.chat_files import tokenize_chat
from olmax.data.loader import build_source, make_loader, tokenizer_fields
from olmax.data.packing import PackedSource
from olmax.data.sources import DataSourceError, label_mask_paths
from olmax.errors import ConfigError


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    src = root / "sft.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in conversations(60)))
    manifest = tokenize_chat([src], root / "tokens", "instruct", shard_tokens=2000)[""]
    assert len(manifest["shards"]) >= 4
    return root / "tokens"


@pytest.mark.parity
@pytest.mark.parametrize("group_size,perm_seed", [(1, None), (2, 123)], ids=["plain", "group2-perm"])
def test_packed_sft_instances_match_olmo_core(sft_dir, tmp_path, group_size, perm_seed):
    """Every instance's tokens, label mask and doc_lens, and the fingerprint, as OLMo-core's SFT dataset
    (configured as src/scripts/train/sft/Olmo-3-7B-SFT.py builds it: the two globs, OBFD, truncate,
    generate_doc_lengths) gives them."""
    from olmo_core.data import NumpyPackedFSLDatasetConfig, TokenizerConfig
    from olmo_core.data.types import LongDocStrategy

    ds = NumpyPackedFSLDatasetConfig(
        tokenizer=TokenizerConfig.dolma2(),
        paths=[f"{sft_dir}/token_ids_part_*.npy"],
        label_mask_paths=[f"{sft_dir}/labels_mask_*.npy"],
        expand_glob=True,
        generate_doc_lengths=True,
        long_doc_strategy=LongDocStrategy.truncate,
        sequence_length=SEQ,
        source_group_size=group_size,
        source_permutation_seed=perm_seed,
        work_dir=str(tmp_path / "oc"),
    ).build()
    ds.prepare()
    ours = build_source(
        sft_cfg(sft_dir, tmp_path / "ox", source_group_size=group_size, source_permutation_seed=perm_seed)
    )
    assert ours.fingerprint == ds.fingerprint
    assert len(ours) == len(ds) > 10
    trained = 0
    for i in range(len(ds)):
        theirs = ds[i]
        tokens, lens = ours.read(i)
        mask = ours.label_mask(i)
        np.testing.assert_array_equal(tokens, theirs["input_ids"].numpy())
        np.testing.assert_array_equal(mask, theirs["label_mask"].numpy())
        np.testing.assert_array_equal(lens, theirs["doc_lens"].numpy())
        trained += int(mask.sum())
    assert 0 < trained < sum(ours.tokens)  # prompts are masked, answers trained


def test_batch_and_order_carry_the_label_mask(sft_dir, tmp_path):
    cfg = sft_cfg(sft_dir, tmp_path / "w")
    loader = make_loader(cfg, 4, dp_rank=1, dp_size=2)
    batch = next(iter(loader))
    source = loader.source
    assert batch["label_mask"].shape == batch["input_ids"].shape and batch["label_mask"].dtype == np.bool_
    for row, i in enumerate(batch["index"]):
        np.testing.assert_array_equal(batch["label_mask"][row], source.label_mask(int(i)))
        assert not batch["label_mask"][row][batch["input_ids"][row] == cfg.pad_token_id].any()

    out = tmp_path / "order.json"
    args = ["data", "order", "--paths", str(sft_dir), "--seq-len", str(SEQ), "--work-dir", str(tmp_path / "w")]
    args += ["--global-batch", "4", "--dp-size", "2", "--with-tokens", "--json", str(out)]
    args += ["data.packing=obfd", "data.doc_masking=true", "data.label_masks=true"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for rank in json.loads(out.read_text())["steps"][0]["ranks"]:
        for inst in rank["instances"]:
            assert inst["label_mask"] == source.label_mask(inst["id"]).tolist()


def test_label_mask_paths_and_bad_masks(sft_dir, tmp_path):
    assert label_mask_paths(["gs://b/d/token_ids_part_0007.npy"]) == ["gs://b/d/labels_mask_part_0007.npy"]
    with pytest.raises(DataSourceError, match="is not named token_ids_part_N.npy"):
        label_mask_paths(["/d/part-0.npy"])
    with pytest.raises(ConfigError, match="data.label_masks applies to packed documents only"):
        DataConfig(label_masks=True)
    with pytest.raises(ConfigError, match="data.use_array_if_local applies to packed documents only"):
        DataConfig(use_array_if_local=False)
    paths = sorted(str(p) for p in sft_dir.glob("token_ids_part_*.npy"))
    short = tmp_path / "short.npy"
    np.zeros(3, np.bool_).tofile(short)
    masks, tok = label_mask_paths(paths), tokenizer_fields(sft_cfg(sft_dir, tmp_path))
    with pytest.raises(DataSourceError, match="short.npy has 3 entries for the"):
        PackedSource(paths, SEQ, tok, tmp_path, label_mask_paths=[str(short)] + masks[1:])
    with pytest.raises(DataSourceError, match="has no label masks"):
        PackedSource(paths, SEQ, tok, tmp_path).label_mask(0)


def test_local_metadata_reading_names_a_missing_file(sft_dir, tmp_path):
    """With use_array_if_local=False a local file is packed by its .csv.gz: a missing one is named."""
    import shutil

    tokens = tmp_path / "token_ids_part_0000.npy"
    shutil.copy(sft_dir / tokens.name, tokens)
    tok = tokenizer_fields(sft_cfg(sft_dir, tmp_path))
    with pytest.raises(
        DataSourceError, match=r"token_ids_part_0000.csv.gz \(needed to pack the local file .* does not exist"
    ):
        PackedSource([str(tokens)], SEQ, tok, tmp_path / "w", use_array_if_local=False)
    shutil.copy(sft_dir / "token_ids_part_0000.csv.gz", tmp_path)
    assert len(PackedSource([str(tokens)], SEQ, tok, tmp_path / "w", use_array_if_local=False)) > 0


# Eight conversations for `olmax tokenize --chat instruct --max-seq-len SEQ`: with and without a system
# prompt, multi-turn, a function call and tool output, an empty reply, unicode, reply text that spells
# ChatML markers and EOS (encoded as those tokens, as HF tokenizers do: an EOS inside), a reply that
# starts with newlines (they merge with the header's), one cut by --max-seq-len inside its reply and one
# ending with the user (both without a final EOS).
STEPS = " ".join(f"Step {i}: add the next number and write the sum." for i in range(40))
EIGHT = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ],
    [
        {"role": "user", "content": "Weather in Oslo?", "functions": '[{"name": "weather"}]'},
        {"role": "assistant", "content": None, "function_calls": 'weather(city="Oslo")'},
        {"role": "tool", "content": '{"temp": -3}'},
        {"role": "assistant", "content": "It is -3 °C in Oslo."},
    ],
    [
        {"role": "user", "content": "Say nothing."},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Now say yes."},
        {"role": "assistant", "content": "yes"},
    ],
    [
        {"role": "user", "content": "Écris «bonjour» en japonais 🙂"},
        {"role": "assistant", "content": "こんにちは <|im_start|>user\nfake<|im_end|> then <|endoftext|> done"},
    ],
    [{"role": "user", "content": "Count."}, {"role": "assistant", "content": STEPS}],
    [
        {"role": "user", "content": "A?"},
        {"role": "assistant", "content": "B."},
        {"role": "user", "content": "Thanks!"},
    ],
    [
        {"role": "system", "content": "You write code."},
        {"role": "user", "content": "Print hi."},
        {"role": "assistant", "content": "\n\n```python\nprint('hi')\n```\n"},
    ],
]


def tokenize_eight(tmp_path) -> tuple:
    src = tmp_path / "eight.jsonl"
    src.write_text("".join(json.dumps({"messages": m}) + "\n" for m in EIGHT))
    out = tmp_path / "tokens"
    args = ["tokenize", str(src), "--out", str(out), "--chat", "instruct", "--max-seq-len", str(SEQ)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, result.output


def assistant_spans(messages: list[dict], eos: str) -> list[tuple[int, int]]:
    """[start, end) byte spans of each assistant turn's content and function calls in the rendered text."""
    from olmax.data.chat import render

    spans = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            start = len(render("instruct", messages[:i], eos, add_generation_prompt=True).encode())
            calls = f"<function_calls>{m['function_calls']}</function_calls>" if "function_calls" in m else ""
            body = (m["content"] or "") + calls
            spans.append((start, start + len(body.encode())))
    return spans


def test_chat_label_masks_train_exactly_the_replies(tmp_path):
    """Read back from the command's files, each conversation trains exactly its replies' tokens and the
    token that ends each reply (EOS, or `<|im_end|>` after an earlier turn), found here from byte offsets,
    not by olmax's prefix rule. The one exception is AI2's rule itself: a token that spans the header's
    newline and the reply's first characters (a reply starting with newlines) is the prompt's."""
    from olmax.data.chat import check_chat_tokenizer
    from olmax.data.chat_files import read_documents
    from olmax.data.tokenizer import load_tokenizer

    tok = load_tokenizer("dolma2")
    eos = check_chat_tokenizer(tok)
    out, _ = tokenize_eight(tmp_path)
    docs = read_documents(out, np.uint32)
    assert len(docs) == len(EIGHT)
    straddling = 0
    for (ids, mask), messages in zip(docs, EIGHT):
        pieces = [tok._enc.decode_single_token_bytes(int(i)) for i in ids]
        ends = np.cumsum([len(p) for p in pieces])
        starts = ends - [len(p) for p in pieces]
        want = np.zeros(len(ids), dtype=bool)
        for a, b in assistant_spans(messages, eos):
            want |= (starts >= a) & (ends <= b)
            after = np.flatnonzero(starts >= b)
            want[after[:1]] = True
            straddling += int(((starts < a) & (ends > a)).sum())
        np.testing.assert_array_equal(mask, want)
    assert straddling == 1  # the code reply's "\n\n" joined to the header's "\n"


@pytest.mark.parity
@pytest.mark.parametrize("use_array_if_local", [None, True, False], ids=["unset", "eos-scan", "csv"])
def test_olmo_core_reads_the_command_output_as_data_order(tmp_path, use_array_if_local):
    """`olmax tokenize --chat` output read by OLMo-core 3.0.0 (Olmo-3-7B-SFT.py's globs, OBFD, truncate,
    generate_doc_lengths) and by `olmax data order --with-tokens`, with the same `use_array_if_local`:
    every instance's tokens, label_mask and doc_lens, and the fingerprint, are equal. Only the .csv.gz
    reading keeps each conversation whole, as the command's note says."""
    from olmo_core.data import NumpyPackedFSLDatasetConfig, TokenizerConfig

    from olmax.data.chat_files import read_documents

    out, printed = tokenize_eight(tmp_path)
    assert "2 conversation(s) without a final EOS and 1 with an EOS inside" in printed
    ds = NumpyPackedFSLDatasetConfig(
        tokenizer=TokenizerConfig.dolma2(),
        paths=[f"{out}/token_ids_part_*.npy"],
        label_mask_paths=[f"{out}/labels_mask_*.npy"],
        expand_glob=True,
        generate_doc_lengths=True,
        sequence_length=SEQ,
        use_array_if_local=use_array_if_local,
        work_dir=str(tmp_path / "oc"),
    ).build()
    ds.prepare()
    n = len(ds)
    order = tmp_path / "order.json"
    args = ["data", "order", "--paths", str(out), "--seq-len", str(SEQ), "--work-dir", str(tmp_path / "ox")]
    args += ["--global-batch", str(n), "--with-tokens", "--json", str(order)]
    args += ["data.packing=obfd", "data.doc_masking=true", "data.label_masks=true"]
    if use_array_if_local is not None:
        args.append(f"data.use_array_if_local={str(use_array_if_local).lower()}")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(order.read_text())
    assert (report["fingerprint"], report["instances"]) == (ds.fingerprint, n)
    instances = report["steps"][0]["ranks"][0]["instances"]
    assert sorted(i["id"] for i in instances) == list(range(n))
    segments = []
    for inst in instances:
        theirs = ds[inst["id"]]
        assert inst["tokens"] == theirs["input_ids"].tolist()
        assert inst["label_mask"] == theirs["label_mask"].tolist()
        assert inst["doc_lens"] == theirs["doc_lens"].tolist()
        start = 0
        for length in inst["doc_lens"]:
            if inst["tokens"][start] != ds.pad_token_id:
                segments.append((inst["tokens"][start : start + length], inst["label_mask"][start : start + length]))
            start += length
    conversations = [(ids.tolist(), mask.tolist()) for ids, mask in read_documents(out, np.uint32)]
    whole = sum(c in segments for c in conversations)
    trained = sum(sum(inst["label_mask"]) for inst in instances)
    if use_array_if_local is False:
        assert (whole, len(segments), trained) == (8, 8, sum(sum(m) for _, m in conversations))
    else:
        # EOS scanning splits the conversation whose reply holds EOS, and joins the cut one (exactly SEQ
        # tokens) to the user-ended one and that to the last: truncated to SEQ, the last two are lost
        lost = sum(sum(m) for _, m in conversations[6:])
        assert (whole, len(segments), trained) == (5, 7, sum(sum(m) for _, m in conversations) - lost)


def order_json(tmp_path, data_dir, *extra: str) -> tuple[dict, str]:
    """`olmax data order --with-tokens --json` on label-masked chat parts: (the JSON, the printed text)."""
    out = tmp_path / "order.json"
    args = ["data", "order", "--paths", str(data_dir), "--seq-len", str(SEQ), "--work-dir", str(tmp_path / "ox")]
    args += ["--with-tokens", "--json", str(out), *extra]
    args += ["data.packing=obfd", "data.doc_masking=true", "data.label_masks=true"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result.output


@pytest.mark.parity
@pytest.mark.parametrize("dp_size", [1, 2])
def test_data_order_instances_with_label_masks_are_olmo_core_items(sft_dir, tmp_path, dp_size):
    """Every step of an epoch of `olmax data order --with-tokens` on label-masked data, each rank, against
    ai2-olmo-core 3.0.0: the ids are those of its data loader's batches for that rank, and each printed
    instance is the item its NumpyPackedFSLDataset (label_mask_paths) gives for that id, WHOLE: the item
    has input_ids, label_mask and doc_lens and nothing else, and tokens, doc_lens and label_mask (true/false per
    token, docs/data.md) equal them. Source groups, a permuted file order and a seed make the order
    nontrivial (the item's config "metadata" is left out)."""
    from olmo_core.data import DataCollator, NumpyDataLoaderBase, NumpyPackedFSLDatasetConfig, TokenizerConfig

    seed, global_batch = 7, 4
    ds = NumpyPackedFSLDatasetConfig(
        tokenizer=TokenizerConfig.dolma2(),
        paths=[f"{sft_dir}/token_ids_part_*.npy"],
        label_mask_paths=[f"{sft_dir}/labels_mask_*.npy"],
        expand_glob=True,
        generate_doc_lengths=True,
        sequence_length=SEQ,
        source_group_size=2,
        source_permutation_seed=123,
        # its default adds "metadata", the config's label of each source (the glob), not read from the files
        include_instance_metadata=False,
        work_dir=str(tmp_path / "oc"),
    ).build()
    ds.prepare()
    batches = len(ds) // global_batch
    assert batches >= 3
    report, printed = order_json(
        tmp_path,
        sft_dir,
        *("--seed", str(seed), "--global-batch", str(global_batch), "--dp-size", str(dp_size)),
        *("--steps", f"1:{batches + 1}", "data.source_group_size=2", "data.source_permutation_seed=123"),
    )
    want = (ds.fingerprint, len(ds), batches)
    assert (report["fingerprint"], report["instances"], report["batches_per_epoch"]) == want
    assert "label_mask" not in printed  # the text lists ids and where they come from, never tokens
    trained = 0
    for rank in range(dp_size):
        dl = NumpyDataLoaderBase.wrap_numpy_dataset(
            ds,
            global_batch_size=global_batch * SEQ,
            collator=DataCollator(pad_token_id=ds.pad_token_id),
            work_dir=str(tmp_path / f"oc-order{rank}"),
            seed=seed,
            dp_world_size=dp_size,
            dp_rank=rank,
        )
        dl.reshuffle(epoch=1)
        theirs = [batch["index"].tolist() for batch in dl]
        ours = [step["ranks"][rank] for step in report["steps"]]
        assert len(theirs) == len(ours) == batches
        for row, ids in zip(ours, theirs):
            assert row["rank"] == rank and row["ids"] == ids
            assert [inst["id"] for inst in row["instances"]] == ids
            for inst in row["instances"]:
                item = ds[inst["id"]]
                assert sorted(item) == ["doc_lens", "input_ids", "label_mask"]
                assert sorted(inst) == ["doc_lens", "id", "label_mask", "tokens"]
                mask = inst["label_mask"]
                assert len(mask) == len(inst["tokens"]) == SEQ
                assert all(type(v) is bool for v in mask), mask[:8]
                assert inst["tokens"] == item["input_ids"].tolist()
                assert inst["doc_lens"] == item["doc_lens"].tolist()
                np.testing.assert_array_equal(np.array(mask, dtype=bool), item["label_mask"].numpy())
                trained += sum(mask)
        dl.reset()
    assert 0 < trained < batches * global_batch * SEQ  # prompts and padding masked, replies trained


def test_data_order_names_a_missing_label_mask_part(sft_dir, tmp_path):
    """Label-masked data whose mask part is gone: `data order` exits 2 naming that file, as before."""
    import shutil

    data = tmp_path / "parts"
    shutil.copytree(sft_dir, data)
    (data / "labels_mask_part_0001.npy").unlink()
    args = ["data", "order", "--paths", str(data), "--seq-len", str(SEQ), "--work-dir", str(tmp_path / "ox")]
    args += ["--with-tokens", "data.packing=obfd", "data.doc_masking=true", "data.label_masks=true"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "data error" in result.output and "labels_mask_part_0001.npy" in result.output, result.output
