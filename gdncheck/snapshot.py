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

from .config import state_fingerprint
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
#: The dtypes a snapshot file may store: float states (the recurrent state float32 or wider), integer counts.
_DTYPES = {"conv_state": ("F64", "F32", "F16", "BF16"), "recurrent_state": ("F64", "F32"), "seq_len": ("I64", "I32")}


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
        """Refuse (a :class:`~gdncheck.errors.SnapshotError`) a snapshot of another schema, of other
        dimensions (its recorded fingerprint, and the fingerprint of its arrays' own shapes, must be
        ``fingerprint``) or of another batch size."""
        if self.schema_version != SNAPSHOT_SCHEMA_VERSION:
            raise SnapshotSchemaError(
                f"{where}: expected snapshot schema version {SNAPSHOT_SCHEMA_VERSION}, found {self.schema_version}"
            )
        shapes = (list(self.conv_state.shape[1:]), list(self.recurrent_state.shape[1:]))
        actual = fingerprint_of_shapes(tuple(self.conv_state.shape), tuple(self.recurrent_state.shape))
        if self.fingerprint != fingerprint or actual != fingerprint:
            found = self.fingerprint if self.fingerprint != fingerprint else f"{actual} (from its arrays' shapes)"
            raise SnapshotDimensionError(
                f"{where}: snapshot was taken from a state of other dimensions: expected fingerprint "
                f"{fingerprint}, found {found} (conv {shapes[0]}, recurrent {shapes[1]})"
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
        """Read a snapshot file, refusing (a :class:`~gdncheck.errors.SnapshotError` naming the file) one
        of another format or schema, a damaged one (bytes that do not match the recorded sha256), and
        one whose contents break the contract: float states of the layouts of docs/spec.md §4 with the
        same batch, finite values, an integer ``seq_len`` of non-negative counts, and a fingerprint
        that is the fingerprint of the arrays' own shapes (so a file cannot claim other dimensions)."""
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
        for name, allowed in _DTYPES.items():
            if f.dtype_of(name) not in allowed:
                raise SnapshotCorruptError(f"{path}: {name} is {f.dtype_of(name)}, expected {' or '.join(allowed)}")
        conv, rec, seq = (f.shape_of(t) for t in _TENSORS)
        if len(conv) != 3 or len(rec) != 4 or len(seq) != 1 or not conv[0] == rec[0] == seq[0]:
            raise SnapshotCorruptError(
                f"{path}: expected conv_state [B, conv_dim, K], recurrent_state [B, Hv, dk, dv], seq_len [B], "
                f"found {list(conv)}, {list(rec)}, {list(seq)}"
            )
        actual = fingerprint_of_shapes(conv, rec)
        if meta.get("fingerprint") != actual:
            raise SnapshotCorruptError(
                f"{path}: the recorded fingerprint {meta.get('fingerprint')!r} is not that of the file's own "
                f"arrays ({actual}: conv {list(conv[1:])}, recurrent {list(rec[1:])}): the file was altered"
            )
        tensors = {t: f.read(t) for t in _TENSORS}
        if _digest(tensors) != meta.get("sha256"):
            raise SnapshotCorruptError(f"{path}: tensor bytes do not match the recorded sha256 (file damaged)")
        for name in ("conv_state", "recurrent_state"):
            bad = int(np.size(tensors[name]) - np.count_nonzero(np.isfinite(tensors[name])))
            if bad:
                raise SnapshotCorruptError(f"{path}: {name} holds {bad} NaN or infinite value(s), expected finite "
                                           f"values")
        if (tensors["seq_len"] < 0).any():
            raise SnapshotCorruptError(f"{path}: seq_len {tensors['seq_len'].tolist()[:8]} holds a negative count, "
                                       f"expected non-negative token counts")
        return cls(tensors["conv_state"], tensors["recurrent_state"], tensors["seq_len"].astype(np.int64),
                   actual, meta.get("warned") == "1", int(version))


def fingerprint_of_shapes(conv_shape: tuple[int, ...], rec_shape: tuple[int, ...]) -> str:
    """The state fingerprint (:func:`gdncheck.config.state_fingerprint`) of a conv state
    ``[B, conv_dim, K]`` and a recurrent state ``[B, Hv, dk, dv]``: ``Hk = (conv_dim - Hv·dv) / (2·dk)``.
    Shapes that no layer has (that Hk not a positive integer) give a fingerprint no config has."""
    conv_dim, K = (int(v) for v in conv_shape[1:3]) if len(conv_shape) == 3 else (-1, -1)
    Hv, dk, dv = (int(v) for v in rec_shape[1:4]) if len(rec_shape) == 4 else (-1, -1, -1)
    twice_key = conv_dim - Hv * dv
    Hk = twice_key // (2 * dk) if dk > 0 and twice_key > 0 and twice_key % (2 * dk) == 0 else -1
    return state_fingerprint({"Hk": Hk, "Hv": Hv, "dk": dk, "dv": dv, "K": K, "conv_dim": conv_dim})


def _digest(tensors: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in _TENSORS:
        arr = np.ascontiguousarray(tensors[name])
        h.update(name.encode())
        h.update(str(arr.dtype).encode())
        h.update(repr(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()
