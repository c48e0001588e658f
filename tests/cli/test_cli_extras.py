"""The core install is a product of its own: with every optional package made unimportable (the
`parity`, `eval`, `wandb`, `tpu`, `gpu-compile` and `remote` extras), each command's --help works,
the core commands run on a small run, and a command or option that needs an extra exits 2 with one
line naming the extra and how to install it, never a traceback.

All commands run in one process (olmax.cli.main, as the `olmax` script calls it), so JAX starts once;
the optional packages are blocked as Python blocks a module whose sys.modules entry is None."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from small_run import SMALL, tokenized_demo
from test_cli_options import commands

# top-level modules of the extras (olmax.extras.EXTRAS) and the namespace the CUDA plugin's PJRT lives in
BLOCKED = ("torch", "transformers", "olmo_core", "lm_eval", "wandb", "libtpu", "jax_cuda12_plugin", "jax_plugins")
BLOCKED += ("gcsfs", "aiohttp", "pyarrow")

# Runs each argv through olmax.cli.main with those modules blocked; prints [{argv, rc, stderr}] as JSON.
RUNNER = textwrap.dedent(
    """
    import contextlib, io, json, sys, traceback
    for name in BLOCKED:
        sys.modules[name] = None
    from olmax.cli import main
    results = []
    for argv in json.loads(sys.stdin.read()):
        err = io.StringIO()
        sys.argv = ["olmax", *argv]
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                main()
                rc = 0
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
                rc = 1
        results.append({"argv": argv, "rc": rc, "stderr": err.getvalue()})
    print(json.dumps(results))
    """
)

# what a user's shell has: none of the settings the test session adds (conftest.py)
USER_ENV = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}


def run_all(argvs: list[list[str]]) -> list[dict]:
    code = f"BLOCKED = {BLOCKED!r}\n{RUNNER}"
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(argvs),
        env=USER_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("core")
    cache, run_dir, ckpt = tmp / "cache", tmp / "run", tmp / "run" / "checkpoints"
    shutil.copytree(tokenized_demo(), cache / "demo")
    (tmp / "text.jsonl").write_text(json.dumps({"text": "A short document to tokenize."}) + "\n")
    (tmp / "model.pt").write_bytes(b"not read: torch is missing")
    (tmp / "chat.parquet").write_bytes(b"not read: pyarrow is missing")
    # one step of one row, as test_cli_quiet's run (the same programs: the session's compilation cache has them)
    small = [o for o in SMALL if not o.startswith(("trainer.max_steps", "schedule.warmup_steps", "trainer.global"))]
    small += ["trainer.max_steps=1", "schedule.warmup_steps=1", "trainer.global_batch=1", f"data.work_dir={cache}"]
    core = {
        "train": ["train", "--recipe", "tiny", "--run-dir", run_dir, *small],
        "config": ["config", "--recipe", "tiny"],
        "flops": ["flops", "--recipe", "olmo3_7b_stage1", "--total-devices", "128", "--chip", "v5p"],
        "status": ["status", run_dir],
        "ckpt inspect": ["ckpt", "inspect", ckpt],
        "data order": ["data", "order", "--recipe", "tiny", "--steps", "1:2", *small],
        "tokenize": ["tokenize", tmp / "text.jsonl", "--out", tmp / "shards"],
        "eval loss": ["eval", "loss", "--ckpt", ckpt, "--data", "demo:heldout", "--max-batches", "1"],
        "generate": ["generate", "--ckpt", ckpt, "--prompt", "Hello", "--max-new-tokens", "2"],
    }
    needs_extra = {
        "parity": (["parity", "--hf", tmp / "hf", "--ckpt", ckpt], "parity"),
        "convert --from-olmo-core": (
            ["convert", "--from-olmo-core", tmp / "model.pt", "--out", tmp / "oc", "--recipe", "tiny"],
            "parity",
        ),
        "eval tasks": (["eval", "tasks", "--ckpt", ckpt, "--tasks", "arc_easy"], "eval"),
        "lm-eval": (["lm-eval", "--model", "olmax", "--tasks", "arc_easy"], "eval"),
        "verify --tasks": (
            ["verify", "--a", run_dir, "--b", run_dir, "--tasks", "arc_easy", "--out", tmp / "v"],
            "eval",
        ),
        "compile-check tpu": (["compile-check", "--recipe", "tiny", "--topology", "tpu7x:2x2x1"], "tpu"),
        "compile-check gpu": (["compile-check", "--recipe", "tiny", "--topology", "h100:1x8"], "gpu-compile"),
        "wandb": (["train", "--recipe", "tiny", "--run-dir", tmp / "w", *small, "wandb.mode=offline"], "wandb"),
        "tokenize --chat parquet": (
            ["tokenize", "--chat", "instruct", tmp / "chat.parquet", "--out", tmp / "c"],
            "parquet",
        ),
        "gs:// data": (["data", "check", "--recipe", "tiny", "--paths", "gs://bucket/part-0.npy"], "remote"),
    }
    helps = {path: [*path.split(), "--help"] for path, _ in commands()}
    argvs = [list(map(str, a)) for a in [*core.values(), *(a for a, _ in needs_extra.values()), *helps.values()]]
    got = iter(run_all(argvs))
    return (
        {name: next(got) for name in core},
        {name: (next(got), extra) for name, (_, extra) in needs_extra.items()},
        {name: next(got) for name in helps},
    )


def test_core_commands_run_without_the_extras(results):
    core, _, _ = results
    for name, r in core.items():
        assert r["rc"] == 0, f"olmax {name}: exit {r['rc']}\n{r['stderr']}"
        assert "Traceback" not in r["stderr"], f"olmax {name}:\n{r['stderr']}"


def test_what_needs_an_extra_names_it_in_one_line(results):
    _, needs_extra, _ = results
    for name, (r, extra) in needs_extra.items():
        lines = r["stderr"].strip().splitlines()
        assert r["rc"] == 2 and len(lines) == 1, f"olmax {name}: exit {r['rc']}\n{r['stderr']}"
        assert f"the `{extra}` extra: pip install -e '.[{extra}]'" in lines[0], lines[0]


def test_every_help_works_without_the_extras(results):
    _, _, helps = results
    for name, r in helps.items():
        if name == "lm-eval":  # its flags are lm-eval's own, so its help is lm-eval's: the extra's line
            assert r["rc"] == 2 and "the `eval` extra" in r["stderr"], r
        else:
            assert r["rc"] == 0 and r["stderr"] == "", f"olmax {name} --help: exit {r['rc']}\n{r['stderr']}"
