"""Where the persistent compilation cache lives (olmax.fit.compile_cache.cache_dir): the documented
default under olmax's cache folder, OLMAX_COMPILE_CACHE to move it (a local folder or a gs:// URL,
kept as written) or turn it off, and a JAX_COMPILATION_CACHE_DIR the user set left as it is."""

from pathlib import Path

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


def test_a_jax_cache_the_user_set_stands():
    environ = {"JAX_COMPILATION_CACHE_DIR": "/mine", compile_cache.ENV: "off"}
    assert compile_cache.cache_dir(environ) == "/mine"
    assert compile_cache.enable(environ) == "/mine"
    assert environ == {"JAX_COMPILATION_CACHE_DIR": "/mine", compile_cache.ENV: "off"}  # nothing set


def test_enable_sets_jax_s_cache_folder_and_bound():
    import jax

    names = ("jax_compilation_cache_dir", "jax_compilation_cache_max_size")
    before = {name: getattr(jax.config, name) for name in names}  # the suite's shared cache
    environ = {compile_cache.ENV: "gs://bucket/jax"}
    try:
        assert compile_cache.enable(environ) == "gs://bucket/jax"
        assert environ["JAX_COMPILATION_CACHE_DIR"] == "gs://bucket/jax"
        assert jax.config.jax_compilation_cache_dir == "gs://bucket/jax"
        assert jax.config.jax_compilation_cache_max_size == compile_cache.MAX_BYTES
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
    assert compile_cache.enable({compile_cache.ENV: "off"}) is None
