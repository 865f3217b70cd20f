"""Snapshots of a layer's state (docs/spec.md §4) and their file format. Neutral: arrays and I/O only.

A :class:`Snapshot` is an independent deep copy: conv state ``[B, conv_dim, K]``, recurrent state
``[B, Hv, dk, dv]``, ``seq_len`` ``[B]``, the schema version, a fingerprint of the dimensions and the
warned-once flag. On disk it is one safetensors file whose metadata carries the schema version,
fingerprint, dimensions and a sha256 of the tensor bytes; a file of another schema, other
dimensions, or damaged bytes is refused with an error that says which.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import (
    SafetensorsFormatError,
    SnapshotCorruptError,
    SnapshotDimensionError,
    SnapshotSchemaError,
)
from .safetensors_io import SafetensorsFile, write_safetensors

SNAPSHOT_SCHEMA_VERSION = 1
SNAPSHOT_FORMAT = "gdncheck-snapshot"
_TENSORS = ("conv_state", "recurrent_state", "seq_len")


@dataclass
class Snapshot:
    conv_state: np.ndarray
    recurrent_state: np.ndarray
    seq_len: np.ndarray
    fingerprint: str
    warned: bool = False
    schema_version: int = SNAPSHOT_SCHEMA_VERSION

    def __post_init__(self) -> None:
        self.conv_state = np.array(self.conv_state, copy=True)
        self.recurrent_state = np.array(self.recurrent_state, copy=True)
        self.seq_len = np.array(self.seq_len, dtype=np.int64, copy=True)

    @property
    def batch(self) -> int:
        return int(self.seq_len.shape[0])

    def copy(self) -> Snapshot:
        return Snapshot(self.conv_state, self.recurrent_state, self.seq_len, self.fingerprint, self.warned,
                        self.schema_version)

    def check_compatible(self, fingerprint: str, batch: int, where: str = "restore") -> None:
        if self.schema_version != SNAPSHOT_SCHEMA_VERSION:
            raise SnapshotSchemaError(
                f"{where}: expected snapshot schema version {SNAPSHOT_SCHEMA_VERSION}, found {self.schema_version}"
            )
        if self.fingerprint != fingerprint:
            raise SnapshotDimensionError(
                f"{where}: snapshot was taken from a state of other dimensions: expected fingerprint "
                f"{fingerprint}, found {self.fingerprint} (conv {list(self.conv_state.shape[1:])}, "
                f"recurrent {list(self.recurrent_state.shape[1:])})"
            )
        if self.batch != batch:
            raise SnapshotDimensionError(f"{where}: expected a snapshot of batch {batch}, found batch {self.batch}")

    # --- files --------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        tensors = {
            "conv_state": np.ascontiguousarray(self.conv_state),
            "recurrent_state": np.ascontiguousarray(self.recurrent_state),
            "seq_len": np.ascontiguousarray(self.seq_len, dtype=np.int64),
        }
        meta = {
            "format": SNAPSHOT_FORMAT,
            "schema_version": str(self.schema_version),
            "fingerprint": self.fingerprint,
            "warned": "1" if self.warned else "0",
            "dims": json.dumps(
                {"conv_state": list(self.conv_state.shape), "recurrent_state": list(self.recurrent_state.shape)}
            ),
            "sha256": _digest(tensors),
        }
        return write_safetensors(path, tensors, meta)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Snapshot:
        try:
            f = SafetensorsFile(path)
        except SafetensorsFormatError as exc:
            raise SnapshotCorruptError(f"snapshot file is damaged: {exc}") from None
        meta = f.metadata
        if meta.get("format") != SNAPSHOT_FORMAT:
            raise SnapshotSchemaError(
                f"{path}: expected a {SNAPSHOT_FORMAT} file, found format {meta.get('format')!r}"
            )
        version = meta.get("schema_version")
        if version != str(SNAPSHOT_SCHEMA_VERSION):
            raise SnapshotSchemaError(
                f"{path}: expected snapshot schema version {SNAPSHOT_SCHEMA_VERSION}, found {version!r}"
            )
        missing = [t for t in _TENSORS if t not in f]
        if missing:
            raise SnapshotCorruptError(f"{path}: expected tensors {', '.join(_TENSORS)}, missing {', '.join(missing)}")
        tensors = {t: f.read(t) for t in _TENSORS}
        if _digest(tensors) != meta.get("sha256"):
            raise SnapshotCorruptError(f"{path}: tensor bytes do not match the recorded sha256 (file damaged)")
        conv, rec, seq = tensors["conv_state"], tensors["recurrent_state"], tensors["seq_len"]
        if conv.ndim != 3 or rec.ndim != 4 or seq.ndim != 1 or not conv.shape[0] == rec.shape[0] == seq.shape[0]:
            raise SnapshotCorruptError(
                f"{path}: expected conv_state [B, conv_dim, K], recurrent_state [B, Hv, dk, dv], seq_len [B], "
                f"found {list(conv.shape)}, {list(rec.shape)}, {list(seq.shape)}"
            )
        return cls(conv, rec, seq.astype(np.int64), meta.get("fingerprint", ""), meta.get("warned") == "1",
                   int(version))


def _digest(tensors: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in _TENSORS:
        arr = np.ascontiguousarray(tensors[name])
        h.update(name.encode())
        h.update(str(arr.dtype).encode())
        h.update(repr(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()
