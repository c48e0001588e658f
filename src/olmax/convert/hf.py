"""HF transformers `Olmo3ForCausalLM` checkpoints <-> olmax checkpoints.

Reading: config.json gives the ModelConfig (checked to be representable in olmax, see
`model_config_from_hf`), then the safetensors tensors are streamed one at a time into the stacked
olmax arrays (olmax.convert.tensors.read_params) and saved as step 0 of an olmax checkpoint.

Writing: config.json in the transformers 5 form (`layer_types`, `sliding_window`, `rope_parameters`
nested by layer type, an explicit `head_dim`) and safetensors shards of at most 5 GB, written one
shard at a time, in the dtype the weights came in (recorded in the checkpoint's meta); plus the
generation config and, unless the export is asked for without one, the tokenizer files
(olmax.convert.hf_tokenizer), so the directory is complete.

This module needs neither torch nor transformers.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Iterable, Optional

import jax
from safetensors.numpy import save_file

from olmax.checkpoint.store import complete_steps, load_params, read_config, read_experiment, save_params
from olmax.config.model import ModelConfig
from olmax.convert.hf_tokenizer import (
    NO_TOKENIZER,
    export_tokenizer,
    tokenizer_special_tokens,
    write_generation_config,
    write_tokenizer_files,
)
from olmax.convert.tensors import (
    ConversionError,
    SafetensorsSource,
    read_params,
    require_empty_output,
    source_dtype,
    torch_tensors,
)
from olmax.errors import ConfigError
from olmax.model.olmo3 import abstract_params, count_params

HF_ARCHITECTURE = "Olmo3ForCausalLM"
HF_MODEL_TYPE = "olmo3"

HF_NAMES = {
    "embed": "model.embed_tokens.weight",
    "layers.q_proj": "model.layers.{i}.self_attn.q_proj.weight",
    "layers.k_proj": "model.layers.{i}.self_attn.k_proj.weight",
    "layers.v_proj": "model.layers.{i}.self_attn.v_proj.weight",
    "layers.o_proj": "model.layers.{i}.self_attn.o_proj.weight",
    "layers.q_norm": "model.layers.{i}.self_attn.q_norm.weight",
    "layers.k_norm": "model.layers.{i}.self_attn.k_norm.weight",
    "layers.attn_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "layers.gate_proj": "model.layers.{i}.mlp.gate_proj.weight",
    "layers.up_proj": "model.layers.{i}.mlp.up_proj.weight",
    "layers.down_proj": "model.layers.{i}.mlp.down_proj.weight",
    "layers.mlp_norm": "model.layers.{i}.post_feedforward_layernorm.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
}

SLIDING, FULL = "sliding_attention", "full_attention"
# Olmo3Config's defaults for fields a config.json may leave out (transformers 5.24).
HF_DEFAULTS = {
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 2048,
    "sliding_window": 4096,
    "rope_theta": 500000.0,
    "initializer_range": 0.02,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
}
# The dolma2 tokenizer's special tokens (docs/reference.md, "Model"), used when a checkpoint does not name its own.
OLMO3_SPECIAL_TOKENS = {"eos_token_id": 100257, "pad_token_id": 100277, "bos_token_id": None}
ROPE_KEYS = {
    "default": {"rope_type", "rope_theta"},
    "yarn": {
        "rope_type",
        "rope_theta",
        "factor",
        "beta_fast",
        "beta_slow",
        "original_max_position_embeddings",
        "attention_factor",
        "truncate",
    },
}
MAX_SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size ("5GB")


# ----------------------------------------------------------------------------------------------
# config.json -> ModelConfig


def read_hf_config(hf_dir: Path) -> dict:
    path = hf_dir / "config.json"
    if not path.is_file():
        raise ConversionError(f"{hf_dir} is not a HF model directory: it has no config.json")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConversionError(f"{path} is not valid JSON: {e}") from None


def _window_pattern(layer_types: list, sliding_window, n_layers: int, where: str) -> tuple[int, int]:
    """HF's per-layer attention types -> olmax's (sliding_window, global_every), or a clear error.

    olmax makes layer i global iff (i + 1) % global_every == 0 or i is the last layer. The period is
    read off the first global layer and the whole list is then checked against it.
    """
    if len(layer_types) != n_layers or set(layer_types) - {SLIDING, FULL}:
        raise ConversionError(
            f"{where}: layer_types must list '{SLIDING}' or '{FULL}' for each of the "
            f"{n_layers} layers, got {layer_types}"
        )
    window = sliding_window or 0
    if FULL not in layer_types:
        raise ConversionError(
            f"{where}: no layer uses full attention; olmax always makes the last layer "
            f"global (layer_types={layer_types})"
        )
    global_every = layer_types.index(FULL) + 1
    olmax_types = [FULL if (i + 1) % global_every == 0 or i == n_layers - 1 else SLIDING for i in range(n_layers)]
    if olmax_types != layer_types:
        short = {SLIDING: "S", FULL: "F"}
        raise ConversionError(
            f"{where}: the attention pattern {''.join(short[t] for t in layer_types)} (S = sliding, F = full) "
            f"is not representable in olmax, which repeats every global_every layers with the last layer "
            f"global; the closest, global_every={global_every}, gives {''.join(short[t] for t in olmax_types)}"
        )
    if SLIDING in layer_types and window <= 0:
        raise ConversionError(f"{where}: layers use sliding attention but sliding_window={sliding_window}")
    return window, global_every


def _rope_by_layer_type(hf: dict, where: str) -> dict[str, dict]:
    """The RoPE parameters of each layer type, read as transformers 5.24's Olmo3Config reads them.

    A config in the nested form is taken as is. A legacy config (transformers 4: `rope_theta`,
    `rope_scaling`) gets what Olmo3Config gives it: the scaling and the theta go to the full-attention
    layers only; sliding layers keep the default theta (500000, which every OLMo 3 release uses).
    """
    rope = copy.deepcopy(hf.get("rope_parameters")) or {
        SLIDING: {"rope_type": "default"},
        FULL: {"rope_type": "default"},
    }
    if not isinstance(rope, dict) or set(rope) - {SLIDING, FULL}:
        raise ConversionError(
            f"{where}: rope_parameters must be keyed by layer type ('{SLIDING}', '{FULL}'), "
            f"got {hf.get('rope_parameters')}"
        )
    full = rope.setdefault(FULL, {"rope_type": "default"})
    full.update(hf.get("rope_scaling") or {})
    full.setdefault("rope_theta", hf.get("rope_theta", HF_DEFAULTS["rope_theta"]))
    rope.setdefault(SLIDING, {"rope_type": "default"}).setdefault("rope_theta", HF_DEFAULTS["rope_theta"])
    for params in rope.values():
        params.setdefault("rope_type", params.pop("type", "default"))
        if params["rope_type"] == "yarn":
            params.setdefault(
                "original_max_position_embeddings",
                hf.get("max_position_embeddings", HF_DEFAULTS["max_position_embeddings"]),
            )
    return rope


def _yarn_attention_factor(factor: float) -> float:
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0  # YaRN's mscale, as transformers computes it


def _rope_fields(params: dict, layer_type: str, hf: dict, where: str) -> dict:
    """One layer type's RoPE parameters -> the ModelConfig fields, or an error naming what olmax lacks."""
    kind = params["rope_type"]
    if kind not in ROPE_KEYS:
        raise ConversionError(
            f"{where}: {layer_type} layers use rope_type={kind!r}; olmax supports {sorted(ROPE_KEYS)}"
        )
    extra = set(params) - ROPE_KEYS[kind]
    if extra:
        raise ConversionError(f"{where}: {layer_type} RoPE parameters {sorted(extra)} are not supported by olmax")
    fields = {"rope_type": kind, "rope_theta": float(params["rope_theta"])}
    if kind == "default":
        return fields
    original = int(params["original_max_position_embeddings"])
    factor = (
        params.get("factor") or hf.get("max_position_embeddings", HF_DEFAULTS["max_position_embeddings"]) / original
    )
    if params.get("truncate", True) is not True:
        raise ConversionError(f"{where}: YaRN with truncate=false is not supported by olmax")
    given = params.get("attention_factor")
    if given is not None and not math.isclose(given, _yarn_attention_factor(factor), rel_tol=1e-9):
        raise ConversionError(
            f"{where}: YaRN attention_factor={given} differs from 0.1*ln(factor)+1="
            f"{_yarn_attention_factor(factor)}, the only one olmax computes"
        )
    fields.update(
        yarn_factor=float(factor),
        yarn_beta_fast=float(params.get("beta_fast") or 32),
        yarn_beta_slow=float(params.get("beta_slow") or 1),
        yarn_original_max_position=original,
    )
    return fields


def _check_architecture(hf: dict, where: str) -> None:
    archs = hf.get("architectures") or []  # may be absent from a hand-made config; model_type may not
    if hf.get("model_type") != HF_MODEL_TYPE or (archs and HF_ARCHITECTURE not in archs):
        raise ConversionError(
            f"{where}: not an OLMo 3 checkpoint (architectures={archs}, model_type="
            f"{hf.get('model_type')!r}); olmax converts {HF_ARCHITECTURE} only"
        )
    for key, wanted in (("hidden_act", "silu"), ("attention_bias", False), ("tie_word_embeddings", False)):
        value = hf.get(key, HF_DEFAULTS[key])
        if value != wanted:
            raise ConversionError(f"{where}: {key}={value!r} is not supported (OLMo 3 has {key}={wanted!r})")


def model_config_from_hf(hf: dict, where: str = "config.json") -> ModelConfig:
    """The ModelConfig of an Olmo3ForCausalLM config.json; a clear error for what olmax cannot represent."""
    _check_architecture(hf, where)
    try:
        n_layers, d_model, n_heads = hf["num_hidden_layers"], hf["hidden_size"], hf["num_attention_heads"]
        vocab_size, mlp_hidden = hf["vocab_size"], hf["intermediate_size"]
    except KeyError as e:
        raise ConversionError(f"{where}: required field {e.args[0]!r} is missing") from None
    layer_types = hf.get("layer_types") or [FULL if (i + 1) % 4 == 0 else SLIDING for i in range(n_layers)]
    window, global_every = _window_pattern(
        layer_types, hf.get("sliding_window", HF_DEFAULTS["sliding_window"]), n_layers, where
    )
    rope = _rope_by_layer_type(hf, where)
    used = [t for t in (SLIDING, FULL) if t in layer_types]
    rope_fields = {t: _rope_fields(rope[t], t, hf, where) for t in used}
    fields = rope_fields[FULL] if FULL in used else rope_fields[SLIDING]
    if len(used) == 2 and rope_fields[SLIDING] != rope_fields[FULL]:
        # The one mix olmax represents: YaRN on the full-attention layers only, plain RoPE with the
        # same theta on the windowed ones (how AI2's long-context configs read in transformers).
        plain_sliding = {"rope_type": "default", "rope_theta": rope_fields[FULL]["rope_theta"]}
        if rope_fields[FULL]["rope_type"] != "yarn" or rope_fields[SLIDING] != plain_sliding:
            raise ConversionError(
                f"{where}: sliding and full-attention layers use different RoPE "
                f"({rope[SLIDING]} vs {rope[FULL]}); olmax supports the same RoPE on both, "
                "or YaRN on the full-attention layers only"
            )
        fields = {**fields, "yarn_layers": "global"}
    elif fields["rope_type"] == "yarn":
        fields = {**fields, "yarn_layers": "all" if SLIDING in used else "global"}
    try:
        return ModelConfig(
            vocab_size=vocab_size,
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            head_dim=hf.get("head_dim") or d_model // n_heads,
            mlp_hidden=mlp_hidden,
            sliding_window=window,
            global_every=global_every,
            norm_eps=float(hf.get("rms_norm_eps", HF_DEFAULTS["rms_norm_eps"])),
            max_position=hf.get("max_position_embeddings", HF_DEFAULTS["max_position_embeddings"]),
            init_std=hf.get("initializer_range", HF_DEFAULTS["initializer_range"]),
            **fields,
        )
    except ConfigError as e:
        raise ConversionError(f"{where}: {e}") from None


# ----------------------------------------------------------------------------------------------
# ModelConfig -> config.json


def _rope_parameters(cfg: ModelConfig, layer_type: str) -> dict:
    scaled = cfg.rope_type == "yarn" and (cfg.yarn_layers == "all" or layer_type == FULL)
    params = {"rope_type": "yarn" if scaled else "default", "rope_theta": cfg.rope_theta}
    if scaled:
        params.update(
            factor=cfg.yarn_factor,
            beta_fast=cfg.yarn_beta_fast,
            beta_slow=cfg.yarn_beta_slow,
            original_max_position_embeddings=cfg.yarn_original_max_position,
            attention_factor=_yarn_attention_factor(cfg.yarn_factor),
        )
    return params


def hf_config(cfg: ModelConfig, *, dtype: str, special_tokens: dict) -> dict:
    """config.json for transformers 5's Olmo3ForCausalLM, with RoPE per layer type (YaRN where
    ModelConfig.yarn_layers puts it)."""
    return {
        "architectures": [HF_ARCHITECTURE],
        "model_type": HF_MODEL_TYPE,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.mlp_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.norm_eps,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "sliding_window": cfg.sliding_window if cfg.sliding_window > 0 else None,
        "layer_types": [FULL if cfg.layer_window(i) is None else SLIDING for i in range(cfg.n_layers)],
        "rope_parameters": {t: _rope_parameters(cfg, t) for t in (SLIDING, FULL)},
        **{k: special_tokens.get(k) for k in OLMO3_SPECIAL_TOKENS},
        "dtype": dtype,
    }


# ----------------------------------------------------------------------------------------------
# Files


def hf_weights(hf_dir: Path) -> SafetensorsSource:
    """The safetensors of a HF directory: the files the index names, or model.safetensors."""
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ConversionError(f"{index} has no weight_map")
        return SafetensorsSource([hf_dir / f for f in sorted(set(weight_map.values()))])
    if (hf_dir / "model.safetensors").is_file():
        return SafetensorsSource([hf_dir / "model.safetensors"])
    raise ConversionError(
        f"{hf_dir} has neither model.safetensors nor model.safetensors.index.json "
        "(only safetensors checkpoints are read)"
    )


def resolve_hf_dir(src: str, revision: Optional[str] = None) -> tuple[Path, dict]:
    """A local HF directory as is, or a hub id ("owner/name") downloaded with huggingface_hub
    (config and safetensors only). Returns the directory and a description for the checkpoint meta."""
    path = Path(src)
    if path.exists():
        if revision is not None:
            raise ConversionError(f"--revision applies to a hub id, but {src} is a local path")
        if not path.is_dir():
            raise ConversionError(f"{src} is not a directory")
        return path, {"format": "hf", "path": str(path.resolve())}
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", src):
        raise ConversionError(f"{src} is neither an existing directory nor a hub id of the form owner/name")
    from huggingface_hub import snapshot_download

    try:
        local = Path(
            snapshot_download(
                src,
                revision=revision,
                allow_patterns=[
                    "config.json",
                    "model.safetensors",
                    "model-*.safetensors",
                    "model.safetensors.index.json",
                ],
            )
        )
    except OSError as e:  # huggingface_hub's errors (not found, offline, HTTP) are all OSErrors
        raise ConversionError(f"cannot download {src} (revision {revision or 'main'}): {e}") from None
    return local, {"format": "hf", "repo_id": src, "revision": revision or "main", "commit": local.name}


def _new_file_mode() -> int:
    """The mode open() gives a new file: 0666 less the umask. safetensors 0.8.0's save_file creates its
    file with mode 0600 whatever the umask, so the weights get this mode, as the export's other files
    have. The umask can only be read by setting it, so it is set back at once."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def write_safetensors(
    tensors: Iterable[tuple[str, object]], out_dir: Path, max_shard_bytes: int = MAX_SHARD_BYTES
) -> list[str]:
    """Write (name, array) pairs as transformers does: model.safetensors, or numbered shards of at most
    `max_shard_bytes` plus model.safetensors.index.json. Only one shard is held in memory at a time."""
    shards: list[list[str]] = []
    total = 0

    def flush(shard: dict) -> None:
        path = out_dir / f"shard-{len(shards):05d}.tmp"
        save_file(shard, str(path), metadata={"format": "pt"})
        path.chmod(_new_file_mode())
        shards.append(list(shard))

    shard: dict = {}
    shard_bytes = 0
    for name, array in tensors:
        if shard and shard_bytes + array.nbytes > max_shard_bytes:
            flush(shard)
            shard, shard_bytes = {}, 0
        shard[name] = array
        shard_bytes += array.nbytes
        total += array.nbytes
    flush(shard)

    if len(shards) == 1:
        (out_dir / "shard-00000.tmp").rename(out_dir / "model.safetensors")
        return ["model.safetensors"]
    files = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    for k, file in enumerate(files):
        (out_dir / f"shard-{k:05d}.tmp").rename(out_dir / file)
    weight_map = {name: file for file, names in zip(files, shards) for name in names}
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
    )
    return files


# ----------------------------------------------------------------------------------------------
# The two directions


def convert_from_hf(src: str, out: str | Path, *, revision: Optional[str] = None) -> dict:
    """HF Olmo3ForCausalLM (a local directory or a hub id) -> olmax checkpoint at `out`, step 0."""
    out = Path(out)
    require_empty_output(out)
    start = time.perf_counter()
    hf_dir, source = resolve_hf_dir(src, revision)
    hf = read_hf_config(hf_dir)
    cfg = model_config_from_hf(hf, where=str(hf_dir / "config.json"))
    weights = hf_weights(hf_dir)
    params = read_params(cfg, weights, HF_NAMES, vocab_rows=[cfg.vocab_size], what=f"HF checkpoint {hf_dir}")
    meta = {
        "source": source,
        "source_dtype": source_dtype(weights),
        "special_tokens": {k: hf.get(k, v) for k, v in OLMO3_SPECIAL_TOKENS.items()},
    }
    save_params(out, params, cfg, meta)
    return {
        "out": str(out),
        "params": count_params(cfg),
        "source": source,
        "source_dtype": meta["source_dtype"],
        "seconds": round(time.perf_counter() - start, 2),
    }


def _special_tokens(meta: dict, tokenizer: str, from_tokenizer: dict) -> dict:
    """The tokenizer's special ids; an error when the checkpoint recorded different ones."""
    recorded = meta.get("special_tokens") or {}
    for key in ("eos_token_id", "pad_token_id"):
        if recorded.get(key) is not None and recorded[key] != from_tokenizer[key]:
            raise ConversionError(
                f"the checkpoint records {key}={recorded[key]} but tokenizer {tokenizer} has "
                f"{from_tokenizer[key]}: give the tokenizer the model was trained with (--tokenizer FILE), "
                f"or export without tokenizer files (--tokenizer {NO_TOKENIZER})"
            )
    return from_tokenizer


def _chat_template(chat: str, tok) -> str:
    """The Jinja source of OLMo 3 chat template `chat`, after checking that `tok` can render it."""
    from olmax.data.chat import ChatError, check_chat_tokenizer, template_text

    try:
        check_chat_tokenizer(tok)
        return template_text(chat)
    except ChatError as e:
        raise ConversionError(str(e)) from None


def trained_chat_template(ckpt: str | Path, step: int) -> Optional[str]:
    """The template (instruct or think) the run that wrote `ckpt` at `step` trained on: the one its
    data directories' manifests record (`olmax tokenize --chat` writes it; a preference directory has
    one in chosen/ and rejected/), read where data.paths point now. None for a checkpoint no training
    run wrote, or data tokenized without a template."""
    from olmax.data.tokenize import MANIFEST, read_manifest

    experiment = read_experiment(ckpt, step)
    found = set()
    for spec in [] if experiment is None else experiment["data"]["paths"]:
        where = Path(spec) if Path(spec).is_dir() else Path(spec).parent  # a directory, or its parts' glob
        for d in (where, where / "chosen", where / "rejected"):
            if (d / MANIFEST).is_file():
                found.add((read_manifest(d).get("chat") or {}).get("template"))
    found.discard(None)
    if len(found) > 1:
        raise ConversionError(
            f"the run trained on data rendered with several chat templates ({', '.join(sorted(found))}): "
            "choose one with --chat, or --chat none"
        )
    return found.pop() if found else None


def _step(ckpt: str | Path, step: Optional[int]) -> int:
    return max(complete_steps(ckpt)) if step is None else step  # read_config has checked there is one


def _recorded_special_tokens(meta: dict, vocab_size: int) -> tuple[dict, dict]:
    """Without a tokenizer: the special ids the checkpoint's meta records (a HF or OLMo-core source
    records them; a training run's checkpoint does not), each kept only if it is a token of the model.
    Returns (the ids to write, None where unknown; the recorded ids left out as outside the vocabulary)."""
    recorded = {k: (meta.get("special_tokens") or {}).get(k) for k in OLMO3_SPECIAL_TOKENS}
    outside = {k: v for k, v in recorded.items() if v is not None and not 0 <= v < vocab_size}
    return {k: None if k in outside else v for k, v in recorded.items()}, outside


def _no_tokenizer_note(special: dict, outside: dict, vocab_size: int) -> str:
    ids = ", ".join(f"{k}={v}" for k, v in special.items())
    note = (
        f"no tokenizer files written (--tokenizer {NO_TOKENIZER}): ship the model's tokenizer with it; "
        f"config.json and generation_config.json have the special ids the checkpoint records: {ids}"
    )
    if outside:
        left_out = ", ".join(f"{k}={v}" for k, v in outside.items())
        note += f" (left out, outside the {vocab_size}-token vocabulary: {left_out})"
    return note


def convert_to_hf(
    ckpt: str | Path,
    out: str | Path,
    *,
    dtype: Optional[str] = None,
    step: Optional[int] = None,
    tokenizer: str = "dolma2",
    chat: str = "auto",
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> dict:
    """olmax checkpoint -> a directory transformers loads as Olmo3ForCausalLM, with its tokenizer
    (`tokenizer`: "dolma2" or a HF tokenizer.json) and generation config. `tokenizer="none"`
    (NO_TOKENIZER) writes no tokenizer files, and the special ids of config.json and
    generation_config.json come from the checkpoint (`_recorded_special_tokens`); the summary's
    `note` says so.

    `chat` ("instruct" or "think", olmax.data.chat.TEMPLATES) writes that OLMo 3 chat template into
    tokenizer_config.json as `chat_template` (it needs tokenizer files and a tokenizer with the ChatML
    tokens); "none" writes none; "auto" (the default) the template the run trained on
    (`trained_chat_template`), none when it did not train on chat data, as for a base model, or when
    the export has no tokenizer files.

    `dtype` defaults to the dtype the weights were converted from (float32 for trained weights).
    The tokenizer is checked before any weights are read. The parameters are restored onto the host
    CPU device, so no accelerator memory is used.
    """
    out = Path(out)
    require_empty_output(out)
    start = time.perf_counter()
    cfg, meta = read_config(ckpt, step)
    dtype = dtype or meta.get("source_dtype", "float32")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConversionError(f"cannot write HF weights as {dtype!r}: choose float32, bfloat16 or float16")
    tok, note = None, {}
    if chat == "auto":
        chat = None if tokenizer == NO_TOKENIZER else trained_chat_template(ckpt, _step(ckpt, step))
    elif chat == "none":
        chat = None
    elif tokenizer == NO_TOKENIZER:
        raise ConversionError(f"a chat template ({chat}) goes in the tokenizer files: drop --tokenizer {NO_TOKENIZER}")
    if tokenizer == NO_TOKENIZER:
        special, outside = _recorded_special_tokens(meta, cfg.vocab_size)
        note = {"note": _no_tokenizer_note(special, outside, cfg.vocab_size)}
    else:
        tok = export_tokenizer(tokenizer, vocab_size=cfg.vocab_size)
        special = _special_tokens(meta, tokenizer, tokenizer_special_tokens(tok))
    template = None if chat is None else _chat_template(chat, tok)
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    params, cfg, meta = load_params(ckpt, step, shardings=jax.tree.map(lambda _: cpu, abstract_params(cfg)))
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_files = (
        []
        if tok is None
        else write_tokenizer_files(out, tokenizer, tok, max_length=cfg.max_position, chat_template=template)
    )
    write_generation_config(out, special)
    (out / "config.json").write_text(json.dumps(hf_config(cfg, dtype=dtype, special_tokens=special), indent=2) + "\n")
    files = write_safetensors(torch_tensors(params, cfg, HF_NAMES, dtype), out, max_shard_bytes)
    return {
        "out": str(out),
        "params": count_params(cfg),
        "dtype": dtype,
        "tokenizer": tokenizer,
        "tokenizer_files": tokenizer_files,
        "chat_template": chat,
        "special_tokens": special,
        "files": files,
        "seconds": round(time.perf_counter() - start, 2),
        **note,
    }
