"""Per-item fields of `olmax tokenize --chat` output: the numbers and booleans a row carries beside its
conversation (a KTO `label`, a per-pair `weight`), kept one value per written document so that an
objective can read them with its items (olmax.data.pairs; TRL's trainers likewise take such columns
from the dataset, KTO's `label`).

    DIR/item_fields.npz     one array per field; document i of DIR (in part order) has value [i]
    DIR/manifest.json       chat.fields: {name: dtype}; chat.partial_fields: {name: rows holding it}

A key is a field when every written row holds it as a number or a boolean: its array is bool when every
value is a boolean, int64 when every value is an integer, float64 otherwise. A key some rows lack (or
hold as text) is left out and counted under partial_fields, so that a loader asking for it can say why
it is missing. Rows `olmax tokenize --chat` skips have no document and no value. A preference row's
fields go to both chosen/ and rejected/.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Optional

import numpy as np

from olmax.errors import ConfigError

FIELDS_FILE = "item_fields.npz"
CONVERSATION_KEYS = ("messages", "chosen", "rejected")


def _is_value(x) -> bool:
    return isinstance(x, (bool, int, float))


class FieldWriter:
    """Collects the written rows' fields; `write(directory)` stores them beside that directory's parts."""

    def __init__(self):
        self.rows = 0
        self.values: dict[str, list] = {}

    def add(self, row: dict) -> None:
        """The fields of the next written row (one document per output directory)."""
        for key, value in row.items():
            if key not in CONVERSATION_KEYS and _is_value(value):
                self.values.setdefault(key, []).append(value)
        self.rows += 1

    def write(self, directory: Path) -> dict:
        """Writes DIR/item_fields.npz (when any key is a field) and returns the manifest's entries."""
        complete = {k: v for k, v in self.values.items() if len(v) == self.rows}
        arrays = {k: np.asarray(v, _dtype_of(v)) for k, v in sorted(complete.items())}
        if arrays:
            buffer = io.BytesIO()
            np.savez(buffer, **arrays)
            tmp = Path(directory) / (FIELDS_FILE + ".tmp")
            with open(tmp, "wb") as f:
                f.write(buffer.getvalue())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, Path(directory) / FIELDS_FILE)
        partial = {k: len(v) for k, v in sorted(self.values.items()) if k not in complete}
        return {"fields": {k: a.dtype.name for k, a in arrays.items()}, "partial_fields": partial}


def _dtype_of(values: list) -> type:
    if all(isinstance(v, bool) for v in values):
        return np.bool_
    if all(isinstance(v, int) for v in values):
        return np.int64
    return np.float64


def fields_digest(directory: Path) -> Optional[str]:
    """sha256 of DIR/item_fields.npz, None without one (a fingerprint takes it when present)."""
    path = Path(directory) / FIELDS_FILE
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def read_field(directory: Path, manifest: dict, name: str, dtype: str, documents: int) -> np.ndarray:
    """Field `name` of every document of DIR as `dtype`. A ConfigError naming DIR and the field when its
    rows do not all hold it, or when a value does not fit `dtype` (a boolean or integer dtype takes only
    values it holds exactly; a float dtype takes any number)."""
    directory = Path(directory)
    path = directory / FIELDS_FILE
    stored = np.load(path) if path.is_file() else {}
    if name not in stored:
        chat = manifest.get("chat") or {}
        partial = (chat.get("partial_fields") or {}).get(name)
        if partial is not None:
            why = f"only {partial} of its {chat.get('written', '?')} rows hold `{name}` as a number or boolean"
        else:
            have = ", ".join(sorted(stored)) or "none"
            why = f"its rows have no field `{name}` (its fields: {have})"
        raise ConfigError(
            f"the per-item field `{name}` is read from {directory}, but {why}: `olmax tokenize --chat` keeps "
            "a key every row holds as a number or boolean"
        )
    values = stored[name]
    if len(values) != documents:
        raise ConfigError(f"{path} holds {len(values)} values of `{name}` for {documents} documents")
    target = np.dtype(dtype)
    cast = values.astype(target)
    if target.kind != "f":
        bad = np.flatnonzero(cast.astype(values.dtype) != values)
        if len(bad):
            raise ConfigError(
                f"the per-item field `{name}` of {directory} is read as {target.name}, but document {bad[0]} "
                f"holds {values[bad[0]].item()!r} ({len(bad)} such documents)"
            )
    return cast
