"""A small, strict, deterministic safetensors reader and writer.

Written here rather than taken from the ``safetensors`` package because (a) NumPy has no bfloat16
and checkpoints store bf16, which we read exactly into float32; (b) fixtures must be byte-identical
on rebuild, so the writer's layout is fixed (names sorted, header padded with spaces to 8 bytes);
(c) a damaged file must give an error that names the file and what is wrong.

Format: 8-byte little-endian header length N, N bytes of JSON header, then the data buffer.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from .dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from .errors import CheckpointError, GDNError, SafetensorsFormatError
from .untrusted import no_surrogates

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
#: Largest header accepted (the format's own limit): a longer one is refused before it is read.
MAX_HEADER = 100 * 1024 * 1024
#: Largest nesting of the header's JSON: a valid header nests three deep (entry, its fields, a list).
MAX_HEADER_DEPTH = 8
#: Largest rank and axis length of a tensor; anything larger is no tensor of a GDN layer.
MAX_RANK = 16
MAX_AXIS = 1 << 40


class TensorNotFoundError(SafetensorsFormatError, KeyError):
    """A tensor name the file does not hold (a ``KeyError`` too, as a mapping's lookup must raise)."""

    code = "tensor_not_found"

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class SafetensorsEncodeError(CheckpointError, ValueError):
    """Arrays that cannot be written as asked (a dtype with no safetensors name, values not exact in
    the requested dtype); a ``ValueError`` too."""

    code = "safetensors_encode"


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"expected every name once, found {', '.join(repr(k) for k in dup[:3])} more than once")
    return dict(pairs)


def _depth(value, limit: int) -> int:
    """Nesting depth of a parsed JSON value (stops counting past ``limit``)."""
    if limit < 0 or not isinstance(value, dict | list):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


def _nonneg_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class SafetensorsFile(Mapping):
    """Read-only view of one safetensors file; tensors are read on access.

    ``file[name]`` returns a NumPy array; BF16 tensors come back as exact float32 values. The header
    is checked whole before anything else is read: its length against the file, its JSON (no
    duplicate keys, bounded nesting), every entry's dtype, shape and offsets (inside the data, no
    overlap, exactly the bytes the shape needs, computed without overflow), so that a size a header
    declares is never allocated before it is known to be there. Every problem is a
    :class:`~gdncheck.errors.SafetensorsFormatError` that names the file and the entry.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            st = self.path.stat()
            size = st.st_size
            if not stat.S_ISREG(st.st_mode):
                raise SafetensorsFormatError(f"expected a safetensors file at {self.path}, found no regular file "
                                             f"(a folder, a device or a pipe)")
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r") if size else None
        except FileNotFoundError:
            raise SafetensorsFormatError(f"expected a safetensors file at {self.path}, found no file") from None
        except OSError as exc:
            raise SafetensorsFormatError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        size = 0 if self._data is None else self._data.size
        if size < 8:
            raise SafetensorsFormatError(f"{self.path}: expected at least 8 bytes, found {size}")
        (n,) = struct.unpack("<Q", bytes(self._data[:8]))
        if n > MAX_HEADER or 8 + n > size:
            raise SafetensorsFormatError(
                f"{self.path}: header length {n} does not fit in a file of {size} bytes (truncated or not safetensors)"
            )
        try:
            header = json.loads(bytes(self._data[8 : 8 + n]).decode("utf-8"), object_pairs_hook=_no_duplicates)
            header = no_surrogates(header)  # names and metadata from a port: safe once, where they enter
        except RecursionError:
            raise SafetensorsFormatError(f"{self.path}: expected a header JSON nested at most {MAX_HEADER_DEPTH} "
                                         f"levels, found one nested deeper") from None
        except (UnicodeDecodeError, ValueError) as exc:
            raise SafetensorsFormatError(f"{self.path}: header is not valid JSON ({exc})") from None
        if not isinstance(header, dict):
            raise SafetensorsFormatError(f"{self.path}: header must be a JSON object, found {type(header).__name__}")
        if _depth(header, MAX_HEADER_DEPTH) > MAX_HEADER_DEPTH:
            raise SafetensorsFormatError(f"{self.path}: expected a header JSON nested at most {MAX_HEADER_DEPTH} "
                                         f"levels, found one nested deeper")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise SafetensorsFormatError(f"{self.path}: __metadata__ must map strings to strings")
        self.metadata: dict[str, str] = dict(meta)
        self._base = 8 + n
        data_size = size - self._base
        self._entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        spans = []
        for name, info in header.items():
            dtype, shape, begin, end = self._entry(name, info, data_size)
            self._entries[name] = (dtype, shape, begin, end)
            spans.append((begin, end, name))
        spans.sort()
        for (_b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise SafetensorsFormatError(f"{self.path}: expected tensors in separate bytes, found {n0!r} and "
                                             f"{n1!r} overlapping")

    def _entry(self, name: str, info, data_size: int) -> tuple[str, tuple[int, ...], int, int]:
        """One header entry, checked: (dtype, shape, begin, end)."""
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise SafetensorsFormatError(f"{where}: expected an object with dtype, shape and data_offsets, found "
                                         f"{_brief(info)}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _NUMPY_OF:
            raise SafetensorsFormatError(f"{where}: expected dtype one of {', '.join(_NUMPY_OF)}, found "
                                         f"{_brief(dtype)}")
        if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_nonneg_int(s) for s in shape):
            raise SafetensorsFormatError(f"{where}: expected shape a list of at most {MAX_RANK} non-negative integers, "
                                         f"found {_brief(shape)}")
        if any(s > MAX_AXIS for s in shape):
            raise SafetensorsFormatError(f"{where}: expected axes of at most {MAX_AXIS} elements, found shape "
                                         f"{_brief(shape)}")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_nonneg_int(o) for o in offsets):
            raise SafetensorsFormatError(f"{where}: expected data_offsets [begin, end] of non-negative integers, found "
                                         f"{_brief(offsets)}")
        begin, end = offsets
        if not begin <= end <= data_size:
            raise SafetensorsFormatError(f"{where}: expected data_offsets inside the {data_size}-byte data buffer, "
                                         f"found [{begin}, {end}) (file truncated?)")
        needed = math.prod(shape) * _NUMPY_OF[dtype].itemsize  # Python integers: no overflow
        if end - begin != needed:
            raise SafetensorsFormatError(f"{where}: expected {needed} bytes for shape {list(shape)} {dtype}, found "
                                         f"{end - begin}")
        return dtype, tuple(shape), begin, end

    def __getitem__(self, name: str) -> np.ndarray:
        return self.read(name)

    def __contains__(self, name: object) -> bool:
        # Mapping's own test would read the whole tensor (it calls __getitem__): the header says it all
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def _get(self, name: str) -> tuple[str, tuple[int, ...], int, int]:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise TensorNotFoundError(f"{self.path}: no tensor {name!r}") from None

    def dtype_of(self, name: str) -> str:
        return self._get(name)[0]

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self._get(name)[1]

    def raw(self, name: str) -> np.ndarray:
        """The stored values in their stored dtype (BF16 as uint16 bits), copied."""
        dtype, shape, begin, end = self._get(name)
        out = np.empty(shape, dtype=_NUMPY_OF[dtype])
        if end > begin:
            out.reshape(-1).view(np.uint8)[:] = self._data[self._base + begin : self._base + end]
        return out

    def read(self, name: str) -> np.ndarray:
        """Values as a native NumPy array; BF16 becomes float32 exactly."""
        arr = self.raw(name)
        if self._entries[name][0] == "BF16":
            return bf16_bits_to_f32(arr)
        return arr.astype(arr.dtype.newbyteorder("="), copy=False)


def _brief(value, limit: int = 60) -> str:
    """A short repr of a header value for a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
        if kind is None or kind not in _NUMPY_OF:
            raise SafetensorsEncodeError(f"tensor {name!r}: dtype {arr.dtype} has no safetensors name")
        if kind == "BF16":
            f32 = np.asarray(arr, dtype=np.float32)
            bits = f32_to_bf16_bits(f32)
            if not np.array_equal(bf16_bits_to_f32(bits), f32, equal_nan=True) or not np.array_equal(
                f32.astype(arr.dtype), arr, equal_nan=True
            ):
                raise SafetensorsEncodeError(f"tensor {name!r} is not exactly representable in bf16")
            data = bits.astype("<u2").tobytes()
        else:
            target = _NUMPY_OF[kind]
            cast = np.ascontiguousarray(arr, dtype=target)
            if kind.startswith("F") and not np.array_equal(cast.astype(arr.dtype), arr, equal_nan=True):
                raise SafetensorsEncodeError(f"tensor {name!r} is not exactly representable as {kind}")
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


class WriteError(GDNError):
    """A file gdncheck was asked to write that cannot be written there (a folder in its place, a
    parent that is a file, no permission)."""

    code = "write"


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (``/proc/self/status``);
    elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all: a temporary file beside it, then a rename (a
    link at ``path`` is replaced, never followed). Refuses a folder or a special file at ``path``.
    The file gets the mode ``open()`` would give it, ``0o666`` less the umask (``0o644`` under umask
    022), not the temporary file's private ``0o600``."""
    path = Path(path)
    if path.is_dir() or (path.exists() and not path.is_file()):
        raise WriteError(f"cannot write {path}: it is {'a folder' if path.is_dir() else 'not a regular file'}; "
                         f"expected a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            if hasattr(os, "fchmod"):  # POSIX (Windows has no such modes)
                os.fchmod(fh.fileno(), 0o666 & ~_umask())
            fh.write(data)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
    return path
