"""Every command of the `olmax` app, sub-apps included: an option means one thing everywhere. A flag
that several commands take is declared once (cli/common.py) with one help and one type; the few flags
that name different things in different commands are listed below with the reason. Every option
says what it does, and every command but `launch` says where it runs JAX (cli.common.runs_on)."""

import inspect
import typing

import typer
from typer.models import ArgumentInfo, OptionInfo

from olmax.cli import common
from olmax.cli.common import app

# (flag, command): what the flag means there, unlike the same flag elsewhere.
OWN_MEANING = {
    ("--out", "convert"): "the new checkpoint or HF directory",
    ("--out", "tokenize"): "the directory of token shards",
    ("--out", "compare"): "the directory of the comparison report",
    ("--out", "verify"): "the directory of the verification report",
    ("--dtype", "convert"): "the weight dtype written by --to-hf, not a compute dtype",
    ("--dtype", "parity"): "float32 or bfloat16 on both sides, olmax and transformers",
    ("--step", "convert"): "the step --to-hf exports, and only with --to-hf",
    ("--tokenizer", "convert"): "the tokenizer --to-hf writes next to the weights",
    ("--tokenizer", "eval domains"): "a shorthand for data.tokenizer, resolved with the experiment",
    ("--seed", "parity"): "the seed of the random tokens",
    ("--seed", "generate"): "the sampling seed",
    ("--seed", "data order"): "a shorthand for data.seed",
    ("--seq-len", "parity"): "the length of the random token sequences",
    ("--data", "eval domains"): "a directory of held-out .jsonl files, one domain each (verify's --domains)",
    ("--from-olmo-core", "convert"): "an OLMo-core model state (weights only)",
    ("--from-olmo-core", "ckpt warm-start"): "an OLMo-core training checkpoint (weights and optimizer)",
    ("--dry-run", "train"): "print the resolved config",
    ("--dry-run", "launch"): "print the files and commands a launch would run",
    ("--run-dir", "demo"): "has a default (runs/demo): the demo needs no arguments",
    ("--json", "status"): "'-' prints the JSON instead of the text",
    ("--landmarks", "compare"): "steps of the gap table, by default 8 spread bins",
    ("--landmarks", "verify"): "steps compared, by default every step both runs hold",
    ("--tasks", "eval tasks"): "defaults to the 8-task suite",
    ("--tasks", "verify"): "none by default: verify runs no tasks unless asked",
    ("--chat", "convert"): "the template --to-hf writes into tokenizer_config.json; also none and auto",
    ("--chat", "generate"): "the template the prompts are rendered with before generating",
}


def commands(typer_app=app, prefix=()):
    """(command path, callback) of every command, sub-apps included."""
    for info in typer_app.registered_commands:
        yield " ".join((*prefix, info.name or info.callback.__name__)), info.callback
    for group in typer_app.registered_groups:
        yield from commands(group.typer_instance, (*prefix, group.name))


def declarations(callback):
    """(first flag or argument name, OptionInfo/ArgumentInfo, type) of each parameter of a command."""
    hints = typing.get_type_hints(callback)
    for name, param in inspect.signature(callback).parameters.items():
        info = param.default
        if isinstance(info, OptionInfo):
            yield info.param_decls[0], info, hints[name]
        elif isinstance(info, ArgumentInfo):
            yield f"<{name}>", info, hints[name]


ALL = [(path, flag, info, kind) for path, cb in commands() for flag, info, kind in declarations(cb)]

# The shared definitions themselves: cli.common's options, and those its option factories make.
SHARED = {
    info.param_decls[0]: info
    for info in [v for v in vars(common).values() if isinstance(v, OptionInfo)]
    + [common.batch_option(0), common.max_batches_option(None)]
}


def test_the_walk_sees_every_command_and_sub_app():
    def leaves(command, prefix=()):  # the command tree as typer builds it for the command line
        for name, sub in getattr(command, "commands", {}).items():
            yield from leaves(sub, (*prefix, name)) if hasattr(sub, "commands") else [" ".join((*prefix, name))]

    paths = [path for path, _ in commands()]
    assert sorted(paths) == sorted(leaves(typer.main.get_command(app)))
    assert {"train", "flops", "launch", "status", "data order", "eval loss", "ckpt inspect", "convert"} <= set(paths)


def test_a_flag_means_one_thing():
    by_flag: dict[str, list] = {}
    for path, flag, info, kind in ALL:
        if (flag, path) not in OWN_MEANING and not flag.startswith("<"):
            by_flag.setdefault(flag, []).append((path, info.help, kind))
    drift = {
        flag: uses
        for flag, uses in by_flag.items()
        if len({(h, k) for _, h, k in uses}) > 1 or (flag in SHARED and any(h != SHARED[flag].help for _, h, _ in uses))
    }
    assert not drift, "declare these once in cli/common.py:\n" + "\n".join(
        f"{flag}: " + "; ".join(f"{p} {h!r} {k}" for p, h, k in uses) for flag, uses in drift.items()
    )


def test_own_meanings_are_real():
    """Each listed flag is declared by that command, and by another one: else the entry says nothing."""
    for flag, path in OWN_MEANING:
        users = [p for p, f, _, _ in ALL if f == flag]
        assert path in users and len(users) >= 2, (flag, path, users)


def test_the_shared_overrides_argument():
    for path, flag, info, _ in ALL:
        if flag == "<overrides>":
            assert info is common.OverridesArg, path


def test_every_option_says_what_it_does():
    silent = [f"{path} {flag}" for path, flag, info, _ in ALL if not info.help]
    assert not silent, silent


def test_every_command_but_launch_says_where_it_runs():
    where = {path: getattr(cb, "runs_on", None) for path, cb in commands()}
    assert where.pop("launch") is None  # its trainers choose on their own hosts
    assert not [p for p, w in where.items() if w not in ("cpu", "accelerator")]
    assert {where[p] for p in ("train", "generate", "eval loss")} == {"accelerator"}
    assert {where[p] for p in ("convert", "status", "ckpt inspect", "flops")} == {"cpu"}


def test_recipe_and_config_go_together():
    for path, cb in commands():
        flags = {flag: info for flag, info, _ in declarations(cb)}
        if "--recipe" in flags or "--config" in flags:
            assert flags.get("--recipe") is common.RecipeOpt and flags.get("--config") is common.ConfigOpt, path
