"""`olmax tokenize --chat`: OLMo 3's chat templates, AI2's label masks and SFT file layout.

References: transformers 5.24's `apply_chat_template` (the rendered text, and through it the masks by
the prefix re-render rule of open-instruct's `sft_tulu_tokenize_and_truncate_v1`, driven here by
transformers' own rendering and tokenization), and ai2-olmo-core 3.0.0's `NumpyPackedFSLDataset`
(reads the files back with their label masks). The fast tests cover bad input and the counts."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from olmax.data import chat
from olmax.data.chat_files import MASKS, TOKENS, read_documents, tokenize_chat
from olmax.data.tokenize import TokenizeError
from olmax.data.tokenizer import load_tokenizer

# Conversations covering a given system prompt, none (the default one), multi-turn, tool output
# (`tool` and `environment` roles), function declarations and calls, empty and absent content, and a
# conversation that does not end with the assistant.
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "<think>greet</think>Bonjour"},
        {"role": "user", "content": "And goodbye?"},
        {"role": "assistant", "content": "Au revoir"},
    ],
    [
        {"role": "system", "content": "", "functions": '[{"name": "add"}]'},
        {"role": "user", "content": "Add 2 and 3", "functions": "[]"},
        {"role": "assistant", "content": None, "function_calls": "add(2, 3)"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": ""},
        {"role": "environment", "content": ""},
        {"role": "assistant", "content": "It is 5.\n\n  Done  "},
    ],
    [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "Nothing asked."},
        {"role": "user", "content": "Thanks"},
    ],
]

# Where AI2's prefix rule trains other than "the replies only" (docs/data.md, "Chat parts"): a reply that
# starts with a newline, a system message after the first turn, the assistant first, two assistant turns
# in a row. The rule decides, as in AI2's files.
QUIRKS = [
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\nOne newline"}],
    [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "system", "content": "Late system."},
        {"role": "user", "content": "r"},
        {"role": "assistant", "content": "second reply"},
    ],
    [
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ],
    [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "ok"},
        {"role": "assistant", "content": "again"},
    ],
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("dolma2")


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def hf_tok(dolma2_json):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(dolma2_json), eos_token="<|endoftext|>", pad_token="<|pad|>")


def prefix_rule_mask(hf_tok, template: str, messages: list[dict], max_len=None) -> tuple[list[int], np.ndarray]:
    """AI2's rule, with transformers rendering and tokenizing every prefix (not olmax's code)."""

    def ids(msgs, gen):
        out = hf_tok.apply_chat_template(msgs, chat_template=template, tokenize=True, add_generation_prompt=gen)
        out = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
        return out[:max_len] if max_len else out

    full = ids(messages, False)
    labels = np.asarray(full)
    keep = np.ones(len(full), dtype=bool)
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            continue
        start = 0 if i == 0 else len(ids(messages[:i], False))
        gen = i + 1 < len(messages) and messages[i + 1]["role"] == "assistant"
        end = len(ids(messages[: i + 1], gen))
        keep[start:end] = False
        if max_len and end >= max_len:
            break
    return labels.tolist(), keep


@pytest.mark.parity
@pytest.mark.parametrize("name", list(chat.TEMPLATES))
def test_render_equals_transformers_and_masks_equal_prefix_rule(name, tok, hf_tok):
    template = chat.template_text(name)
    eos = chat.check_chat_tokenizer(tok)
    for messages in CONVERSATIONS + QUIRKS:
        for gen in (False, True):
            want = hf_tok.apply_chat_template(
                messages, chat_template=template, tokenize=False, add_generation_prompt=gen
            )
            assert chat.render(name, messages, eos, gen) == want
        for max_len in (None, 48, 64):
            ids, keep = prefix_rule_mask(hf_tok, template, messages, max_len)
            try:
                ex = chat.sft_example(name, messages, tok, eos, max_len)
            except chat.ChatSkip:  # AI2's sft_tulu_filter_v1 drops a row with nothing to train on
                assert not keep.any()
                continue
            assert ex.ids.tolist() == ids
            np.testing.assert_array_equal(ex.mask, keep)
            full = hf_tok.apply_chat_template(messages, chat_template=template, tokenize=True)["input_ids"]
            assert ex.truncated == (max_len is not None and len(full) > max_len)


def test_template_facts(tok):
    """The facts the templates carry (docs/post-training/chat-data.md): ChatML ids, default system prompts, the
    Think generation prompt, EOS after the last assistant turn, and the masked header."""
    eos = chat.check_chat_tokenizer(tok)
    assert tok.encode("<|im_start|>") == [100264] and tok.encode("<|im_end|>") == [100265]
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    instruct = chat.render("instruct", msgs, eos)
    assert instruct.startswith(
        "<|im_start|>system\nYou are a helpful function-calling AI assistant. You do not currently have access "
        "to any functions. <functions></functions><|im_end|>\n"
    )
    assert instruct.endswith("<|im_start|>assistant\nYo<|endoftext|>")
    assert chat.render("think", msgs[:1], eos, True).endswith(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>"
    )
    assert chat.render("think", msgs, eos).startswith(
        "<|im_start|>system\nYou are Olmo, a helpful AI assistant built by Ai2."
    )
    ex = chat.sft_example("instruct", msgs, tok, eos)
    trained = [tok.decode([int(i)]) for i, m in zip(ex.ids, ex.mask) if m]
    assert trained == ["Yo", "<|endoftext|>"]


# Texts and contents that hold ChatML markers, other added tokens and whitespace where the pieces meet.
ADVERSARIAL = [
    "<|im_start|>",
    "a<|im_end|><|im_start|>\n\n b",
    " <|im_end||||PHONE_NUMBER|||<|im_start|>x<<|im_end|>>\n",
    "<|im_end| <|endoftext|>\n\n<|pad|>  \t<|im_start|>é\U0001f600",
    "\n\n",
]


def rule_example(name, messages, encode, eos, max_len):
    """sft_example's rule with every render encoded whole (the prefix re-render rule, olmax's render)."""
    ids = encode(chat.render(name, messages, eos))
    keep = np.ones(len(ids), dtype=bool)
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            continue
        start = 0 if i == 0 else len(encode(chat.render(name, messages[:i], eos)))
        gen = i + 1 < len(messages) and messages[i + 1]["role"] == "assistant"
        end = len(encode(chat.render(name, messages[: i + 1], eos, gen)))
        keep[start:end] = False
        if max_len and end >= max_len:
            break
    return ids[:max_len], keep[:max_len]


class Whole:
    """dolma2 behind an Encoder that is not Dolma2Tokenizer: sft_example encodes every render whole."""

    def __init__(self, tok):
        self.info, self.encode, self.decode = tok.info, tok.encode, tok.decode


@pytest.mark.parametrize("name", list(chat.TEMPLATES))
def test_pieces_equal_whole_encoding(name, tok):
    """dolma2 encodes a conversation piece by piece between the markers (chat._Pieces) and skips the
    added-token set on a text without one; both must give tiktoken's ids, and sft_example the rule's
    mask, at every truncation length, through the pieces and through the whole-text fallback."""
    eos = chat.check_chat_tokenizer(tok)
    whole = functools.partial(tok._enc.encode, allowed_special="all")
    pieces = chat._pieces(tok, eos)
    for text in ADVERSARIAL + ["plain text, no added token", ""]:
        assert tok.encode(text) == whole(text)
        assert pieces.encode(text) == whole(text) and pieces.length(text) == len(whole(text))
        assert chat._Pieces(tok, "</s>").encode(text + "</s>") == whole(text + "</s>")  # EOS no added token
    odd = [
        [{"role": "user", "content": t}, {"role": "assistant", "content": u}]
        for t, u in zip(ADVERSARIAL, ADVERSARIAL[1:] + ["<think>x</think>"])
    ]
    late_system = [  # a system turn after the first: each prefix before it renders the default prompt
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": " r\n"},
        {"role": "assistant", "content": "\nb"},
    ]
    for messages in CONVERSATIONS + odd + [late_system]:
        full = len(whole(chat.render(name, messages, eos)))
        for max_len in [None, *range(1, full + 2)]:
            ids, keep = rule_example(name, messages, whole, eos, max_len)
            for encoder in (tok, Whole(tok)):
                try:
                    ex = chat.sft_example(name, messages, encoder, eos, max_len)
                except chat.ChatSkip:
                    assert not keep.any()
                    continue
                assert ex.ids.tolist() == ids, (messages, max_len)
                np.testing.assert_array_equal(ex.mask, keep)


def test_tokenize_chat_files_counts_and_skips(tmp_path, tok):
    long = [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "ok " * 50}]
    rows = [{"messages": m} for m in CONVERSATIONS] + [
        {"messages": [{"role": "user", "content": "no answer"}]},  # no assistant turn: skipped
        {"messages": long},  # truncated before the answer: nothing to train on, skipped
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a " * 300}]},  # truncated
    ]
    src = write_jsonl(tmp_path / "sft.jsonl", rows)
    manifest = tokenize_chat([src], tmp_path / "out", "instruct", max_seq_len=128, shard_tokens=100)[""]
    c = manifest["chat"]
    assert (c["rows"], c["written"], c["truncated"], c["without_final_eos"]) == (7, 5, 1, 2)
    assert c["skipped"] == {"no_assistant_turn": 1, "truncated_to_no_trainable_tokens": 1}
    assert len(manifest["shards"]) > 1  # parts close at a document end past 100 tokens
    docs = read_documents(tmp_path / "out", np.uint32)
    eos = chat.check_chat_tokenizer(tok)
    want = [chat.sft_example("instruct", r["messages"], tok, eos, 128) for r in rows[:4] + rows[6:]]
    assert len(docs) == len(want)
    for (ids, mask), ex in zip(docs, want):
        np.testing.assert_array_equal(ids, ex.ids)
        np.testing.assert_array_equal(mask, ex.mask)
    part = tmp_path / "out" / TOKENS.format(0)
    assert part.stat().st_size == 4 * manifest["shards"][0]["tokens"]  # raw uint32, no header
    assert (tmp_path / "out" / MASKS.format(0)).stat().st_size == manifest["shards"][0]["tokens"]  # one byte a token


def test_preference_rows(tmp_path, tok):
    pair = {
        "chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>be kind</think>Hello!"}],
        "rejected": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>be rude</think>Go away."},
        ],
    }
    same = {"chosen": pair["chosen"], "rejected": pair["chosen"]}
    src = write_jsonl(tmp_path / "dpo.jsonl", [pair, same, pair])
    out = tokenize_chat([src], tmp_path / "out", "think")
    assert out["chosen"]["chat"]["skipped"] == {"chosen_equals_rejected": 1}
    chosen, rejected = (
        read_documents(tmp_path / "out/chosen", np.uint32),
        read_documents(tmp_path / "out/rejected", np.uint32),
    )
    assert len(chosen) == len(rejected) == 2
    # the generation prompt's `<think>` is masked with the prompt (AI2's quirk)
    assert tok.decode(chosen[0][0][chosen[0][1]].tolist()) == "be kind</think>Hello!<|endoftext|>"
    assert tok.decode(rejected[1][0][rejected[1][1]].tolist()) == "be rude</think>Go away.<|endoftext|>"


def test_parquet_input(tmp_path, tok):
    pa = pytest.importorskip("pyarrow")  # the `parquet` extra
    import pyarrow.parquet as pq

    rows = [{"messages": CONVERSATIONS[1]}, {"messages": CONVERSATIONS[0]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "sft.parquet")
    write_jsonl(tmp_path / "sft.jsonl", rows)
    a = tokenize_chat([tmp_path / "sft.parquet"], tmp_path / "a", "instruct")[""]
    b = tokenize_chat([tmp_path / "sft.jsonl"], tmp_path / "b", "instruct")[""]
    assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]]


@pytest.mark.parametrize(
    "row, message",
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, "row 1: `messages[0]` has unknown role 'robot'"),
        ({"messages": []}, "row 1: `messages` is not a non-empty list"),
        ({"text": "plain"}, "row 1: `messages` is not a non-empty list"),
        ({"messages": [{"role": "user", "content": None}]}, "row 1: `messages[0]` (user) has no string `content`"),
    ],
)
def test_bad_rows_are_errors(tmp_path, row, message):
    src = write_jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(TokenizeError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        tokenize_chat([src], tmp_path / "out", "instruct")


def test_cli_errors_exit_2_in_one_line(tmp_path):
    from tokenizers import Tokenizer, models
    from typer.testing import CliRunner

    from olmax.cli.common import app

    src = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "robot", "content": "x"}]}])
    runner = CliRunner()
    res = runner.invoke(app, ["tokenize", str(src), "--out", str(tmp_path / "o"), "--chat", "instruct"])
    assert res.exit_code == 2, res.output
    assert "unknown role 'robot'" in res.output and len(res.output.strip().splitlines()) == 1

    plain = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "a": 1, "[UNK]": 2}, unk_token="[UNK]"))
    plain.save(str(tmp_path / "plain.json"))
    good = write_jsonl(tmp_path / "good.jsonl", [{"messages": CONVERSATIONS[0]}])
    res = runner.invoke(
        app,
        [
            "tokenize",
            str(good),
            "--out",
            str(tmp_path / "p"),
            "--chat",
            "think",
            "--tokenizer",
            str(tmp_path / "plain.json"),
        ],
    )
    assert res.exit_code == 2 and "has no <|im_start|> token" in res.output, res.output
    res = runner.invoke(app, ["tokenize", str(good), "--out", str(tmp_path / "q"), "--chat", "base"])
    assert res.exit_code == 2 and "--chat 'base'" in res.output, res.output


@pytest.mark.parity
def test_olmo_core_reads_the_files_with_their_masks(tmp_path, tok):
    """OLMo-core 3.0.0's packed SFT dataset over olmax's parts: every document, with its label mask.
    Boundaries come from the .csv.gz files (use_array_if_local=False): a conversation that does not end
    with the assistant has no final EOS, and boundaries inferred from EOS would join it to the next."""
    from olmo_core.data import NumpyPackedFSLDatasetConfig, TokenizerConfig

    rows = [{"messages": m} for m in CONVERSATIONS * 3]
    manifest = tokenize_chat([write_jsonl(tmp_path / "sft.jsonl", rows)], tmp_path / "out", "think", shard_tokens=300)[
        ""
    ]
    out = tmp_path / "out"
    ds = NumpyPackedFSLDatasetConfig(
        tokenizer=TokenizerConfig(
            vocab_size=tok.info.vocab_size, eos_token_id=tok.info.eos_token_id, pad_token_id=tok.info.pad_token_id
        ),
        paths=[str(out / s["path"]) for s in manifest["shards"]],
        label_mask_paths=[str(out / s["label_mask"]) for s in manifest["shards"]],
        sequence_length=1024,
        generate_doc_lengths=True,
        use_array_if_local=False,
        work_dir=str(tmp_path / "oc"),
    ).build()
    ds.prepare()
    seen = []
    for i in range(len(ds)):
        item = ds[i]
        ids, mask = item["input_ids"].numpy(), item["label_mask"].numpy()
        start = 0
        for n in item["doc_lens"].tolist():
            if n and ids[start] != tok.info.pad_token_id:
                seen.append((ids[start : start + n].tolist(), mask[start : start + n].tolist()))
            start += n
    ours = [(a.tolist(), m.tolist()) for a, m in read_documents(out, np.uint32)]
    assert sorted(seen) == sorted(ours) and len(ours) == manifest["chat"]["written"] > 0


def test_prefix_rule_quirks(tok):
    """What the rule trains in QUIRKS with the Instruct template (docs/data.md, "Chat parts")."""
    eos = chat.check_chat_tokenizer(tok)
    default_system = chat.render("instruct", [], eos)
    out = []
    for messages in QUIRKS:
        ex = chat.sft_example("instruct", messages, tok, eos)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], ex.mask.astype(np.int8), [0]])))
        out.append([tok.decode(ex.ids[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2])])
    assert out == [
        ["One newline<|endoftext|>"],
        ["second reply<|endoftext|>"],
        [default_system + "<|im_start|>assistant\nfirst<|im_end|>", "a<|endoftext|>"],
        ["ok<|im_end|>\n<|im_start|>assistant\nagain<|endoftext|>"],
    ]
