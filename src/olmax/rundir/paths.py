"""Small files of a run directory that is a local path or a URL (gs://bucket/run), through fsspec.

A whole-file write is atomic in both: locally a temporary file renamed over the target, on GCS an
object upload (an object appears complete or not at all). Object stores cannot append, so appending
writers (metrics.jsonl, the launch log) rewrite their object: see olmax.trainer.metrics.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional


def is_url(path: str | os.PathLike) -> bool:
    return "://" in os.fspath(path)


def clean(path: str | os.PathLike) -> str:
    """The run directory as a string: a URL without a trailing '/', a local path as given. A URL that
    pathlib mangled ('gs://b/x' -> 'gs:/b/x') is refused by name."""
    text = os.fspath(path)
    if is_url(text):
        return text.rstrip("/")
    if re.match(r"^[a-z][a-z0-9+.-]*:/[^/]", text):
        from olmax.errors import ConfigError

        raise ConfigError(
            f"run directory {text} looks like a URL that lost a '/' (pathlib.Path turns "
            "'gs://b/x' into 'gs:/b/x'); pass the URL as a string"
        )
    return str(Path(text))


def join(run_dir: str | os.PathLike, *names: str) -> str:
    text = os.fspath(run_dir)
    if is_url(text):
        return "/".join([text.rstrip("/"), *names])
    return str(Path(text, *names))


def _fs(path: str):
    from olmax.extras import url_to_fs

    return url_to_fs(path)


def makedirs(run_dir: str | os.PathLike) -> None:
    """Create a local run directory (a URL needs none: object stores have no directories)."""
    if not is_url(run_dir):
        Path(run_dir).mkdir(parents=True, exist_ok=True)


def read_text(run_dir: str | os.PathLike, name: str) -> Optional[str]:
    """The file's text, or None when it does not exist."""
    path = join(run_dir, name)
    if not is_url(path):
        try:
            return Path(path).read_text()
        except FileNotFoundError:
            return None
    fs, p = _fs(path)
    try:
        return fs.cat_file(p).decode()
    except FileNotFoundError:
        return None


def list_dir(directory: str | os.PathLike) -> list[str]:
    """The names directly under `directory` (local or a URL); [] when it does not exist."""
    text = os.fspath(directory)
    if not is_url(text):
        try:
            return sorted(os.listdir(text))
        except (FileNotFoundError, NotADirectoryError):
            return []
    fs, p = _fs(text)
    fs.invalidate_cache(p)
    try:
        return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(p, detail=False))
    except FileNotFoundError:
        return []


def size(path: str) -> Optional[int]:
    """Bytes in the file at `path` (a joined path), or None when it does not exist."""
    if not is_url(path):
        try:
            return os.path.getsize(path)
        except FileNotFoundError:
            return None
    fs, p = _fs(path)
    fs.invalidate_cache(p)
    try:
        return int(fs.size(p))
    except FileNotFoundError:
        return None


def read_range(path: str, start: int, end: int) -> bytes:
    """Bytes start..end of the file at `path` (a joined path)."""
    if not is_url(path):
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(end - start)
    fs, p = _fs(path)
    return fs.cat_file(p, start=start, end=end)


def write_text(run_dir: str | os.PathLike, name: str, text: str) -> None:
    """Replace the file with `text`, atomically (readers see the old or the new file, never a part)."""
    path = join(run_dir, name)
    if not is_url(path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{path}.tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
        return
    fs, p = _fs(path)
    fs.pipe_file(p, text.encode())


def upload(local: str | os.PathLike, run_dir: str, name: str) -> None:
    """Copy the local file over RUN_DIR/name (one object upload: readers see the old or the new file)."""
    fs, p = _fs(join(run_dir, name))
    fs.put_file(os.fspath(local), p)


def remove(run_dir: str | os.PathLike, name: str) -> None:
    """Delete the file if it exists."""
    path = join(run_dir, name)
    if not is_url(path):
        Path(path).unlink(missing_ok=True)
        return
    fs, p = _fs(path)
    try:
        fs.rm_file(p)
    except FileNotFoundError:
        pass
    fs.invalidate_cache()
