"""A small, strict, deterministic safetensors reader and writer.

Written here rather than taken from the ``safetensors`` package because (a) NumPy has no bfloat16
and checkpoints store bf16, which we read exactly into float32; (b) fixtures must be byte-identical
on rebuild, so the writer's layout is fixed (names sorted, header padded with spaces to 8 bytes);
(c) a damaged file must give an error that names the file and what is wrong.

Format: 8-byte little-endian header length N, N bytes of JSON header, then the data buffer.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from .dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from .errors import SafetensorsFormatError

_NUMPY_OF = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "U16": np.dtype("<u2"),
    "U32": np.dtype("<u4"),
    "U64": np.dtype("<u8"),
    "BOOL": np.dtype("?"),
}
_NAME_OF = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
    np.dtype("int16"): "I16",
    np.dtype("int8"): "I8",
    np.dtype("uint8"): "U8",
    np.dtype("uint16"): "U16",
    np.dtype("uint32"): "U32",
    np.dtype("uint64"): "U64",
    np.dtype("bool"): "BOOL",
}
MAX_HEADER = 100 * 1024 * 1024


class SafetensorsFile(Mapping):
    """Read-only view of one safetensors file; tensors are read on access.

    ``file[name]`` returns a NumPy array; BF16 tensors come back as exact float32 values.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r") if self.path.stat().st_size else None
        except FileNotFoundError:
            raise SafetensorsFormatError(f"expected a safetensors file at {self.path}, found no file") from None
        except OSError as exc:
            raise SafetensorsFormatError(f"cannot read {self.path}: {exc}") from None
        size = 0 if self._data is None else self._data.size
        if size < 8:
            raise SafetensorsFormatError(f"{self.path}: expected at least 8 bytes, found {size}")
        (n,) = struct.unpack("<Q", bytes(self._data[:8]))
        if n > MAX_HEADER or 8 + n > size:
            raise SafetensorsFormatError(
                f"{self.path}: header length {n} does not fit in a file of {size} bytes (truncated or not safetensors)"
            )
        try:
            header = json.loads(bytes(self._data[8 : 8 + n]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SafetensorsFormatError(f"{self.path}: header is not valid JSON ({exc})") from None
        if not isinstance(header, dict):
            raise SafetensorsFormatError(f"{self.path}: header must be a JSON object, found {type(header).__name__}")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise SafetensorsFormatError(f"{self.path}: __metadata__ must map strings to strings")
        self.metadata: dict[str, str] = dict(meta)
        self._base = 8 + n
        data_size = size - self._base
        self._entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        spans = []
        for name, info in header.items():
            try:
                dtype = info["dtype"]
                shape = tuple(int(s) for s in info["shape"])
                begin, end = (int(o) for o in info["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise SafetensorsFormatError(f"{self.path}: entry {name!r} lacks dtype/shape/data_offsets") from None
            if dtype not in _NUMPY_OF:
                raise SafetensorsFormatError(
                    f"{self.path}: tensor {name!r} has dtype {dtype!r}, expected one of {', '.join(_NUMPY_OF)}"
                )
            if any(s < 0 for s in shape) or not 0 <= begin <= end <= data_size:
                raise SafetensorsFormatError(
                    f"{self.path}: tensor {name!r} spans bytes [{begin}, {end}) of a {data_size}-byte buffer "
                    f"(file truncated?)"
                )
            expected = int(np.prod(shape, dtype=np.int64)) * _NUMPY_OF[dtype].itemsize
            if end - begin != expected:
                raise SafetensorsFormatError(
                    f"{self.path}: tensor {name!r} of shape {list(shape)} {dtype} needs {expected} bytes, "
                    f"found {end - begin}"
                )
            self._entries[name] = (dtype, shape, begin, end)
            spans.append((begin, end, name))
        spans.sort()
        for (_b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise SafetensorsFormatError(f"{self.path}: tensors {n0!r} and {n1!r} overlap")

    def __getitem__(self, name: str) -> np.ndarray:
        return self.read(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def dtype_of(self, name: str) -> str:
        return self._entries[name][0]

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def raw(self, name: str) -> np.ndarray:
        """The stored values in their stored dtype (BF16 as uint16 bits), copied."""
        if name not in self._entries:
            raise KeyError(name)
        dtype, shape, begin, end = self._entries[name]
        buf = self._data[self._base + begin : self._base + end] if end > begin else np.zeros(0, np.uint8)
        return np.frombuffer(buf.tobytes(), dtype=_NUMPY_OF[dtype]).reshape(shape).copy()

    def read(self, name: str) -> np.ndarray:
        """Values as a native NumPy array; BF16 becomes float32 exactly."""
        arr = self.raw(name)
        if self._entries[name][0] == "BF16":
            return bf16_bits_to_f32(arr)
        return arr.astype(arr.dtype.newbyteorder("="), copy=False)


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    f = SafetensorsFile(path)
    return {name: f.read(name) for name in f}, dict(f.metadata)


def encode_safetensors(
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
    dtypes: Mapping[str, str] | None = None,
) -> bytes:
    """The file's bytes. ``dtypes`` may ask for ``"BF16"`` (values must be exactly bf16)."""
    dtypes = dict(dtypes or {})
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        arr = np.asarray(tensors[name])
        kind = dtypes.get(name) or _NAME_OF.get(arr.dtype)
        if kind is None:
            raise TypeError(f"tensor {name!r}: dtype {arr.dtype} has no safetensors name")
        if kind == "BF16":
            f32 = np.asarray(arr, dtype=np.float32)
            bits = f32_to_bf16_bits(f32)
            if not np.array_equal(bf16_bits_to_f32(bits), f32, equal_nan=True) or not np.array_equal(
                f32.astype(arr.dtype), arr, equal_nan=True
            ):
                raise ValueError(f"tensor {name!r} is not exactly representable in bf16")
            data = bits.astype("<u2").tobytes()
        else:
            target = _NUMPY_OF[kind]
            cast = np.ascontiguousarray(arr, dtype=target)
            if kind.startswith("F") and not np.array_equal(cast.astype(arr.dtype), arr, equal_nan=True):
                raise ValueError(f"tensor {name!r} is not exactly representable as {kind}")
            data = cast.tobytes()
        header[name] = {"dtype": kind, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def write_safetensors(
    path: str | os.PathLike,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
    dtypes: Mapping[str, str] | None = None,
) -> Path:
    """Write atomically: the file appears whole or not at all."""
    return write_bytes_atomic(path, encode_safetensors(tensors, metadata, dtypes))


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path
