"""Name tables: let a port write the tensor names it already dumps (``verify --names hf|doppler|metrale``).

A table (``conformance/judge/names/<port>.json``, format ``gdncheck-names`` v1; docs/names.md) maps
a port's tensor name to the stage vocabulary:

- ``{"as": "x_norm"}``: the same tensor under another name; when its shape differs from the golden's
  with the same number of elements it is reshaped row-major (flat ``[T, Hv*dv]`` rows, transformers'
  ``[B*T*Hv, dv]`` norm rows); ``"transpose": [axes]`` first permutes the axes;
- ``{"split": [{"as": ..., "width": SYMBOL}, ...]}``: consecutive slices of the last axis (widths are
  shape symbols: ``key_dim``, ``value_dim``, ``conv_dim``, ``Hv``, ...), each judged as its own tensor;
- ``{"not_comparable": REASON}``: a tensor that is not one of ours (a decay factor ``exp(g)``, a norm
  without its gate); verify notes it and does not judge it.

``prefixes`` are regular expressions removed from a name before lookup (layer prefixes). Canonical
names always work too; a name that is neither is reported in the case's notes.

:class:`NamedOutputs` is an outputs (or snapshot) file seen through a table: canonical keys in,
converted arrays out. Verify uses it for every file, with or without a table, so that unknown names
are always reported.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from gdncheck.fixtures.manifest import FixtureError
from gdncheck.stages import KNOWN_TENSORS, TENSOR_ORDER
from gdncheck.untrusted import read_json

NAMES_DIR = Path(__file__).with_name("names")
NAMES_FORMAT = "gdncheck-names"
NAMES_VERSION = 1
#: names an outputs file may hold besides the vocabulary (the input, the seq_len bookkeeping)
KNOWN_EXTRA = ("x", "seq_len")
#: how the notes about names open (:meth:`NamedOutputs.notes`)
NOTE_OPENINGS = ("not compared (", "unknown tensor name(s) ignored")
#: Largest name table read (the packaged ones are a few kB).
MAX_TABLE_BYTES = 4 * 1024 * 1024


class NameTableError(FixtureError):
    """A name table (``--names``) that cannot be used: not found, not JSON, not of the format, or a
    width that is no shape symbol of the case. A :class:`FixtureError`, as it was before, so that every
    caller (and the CLI's exit 2) treats it as before."""

    code = "name_table"


def builtin_tables() -> list[str]:
    return sorted(p.stem for p in NAMES_DIR.glob("*.json"))


class NameTable:
    """A name table, checked whole when it is read (:func:`check_table`): every entry one of the forms
    of docs/names.md, every target a stage tensor, every prefix a regular expression."""

    def __init__(self, doc: dict, source: str):
        check_table(doc, source)
        self.port = str(doc.get("port", Path(source).stem))
        self.source = source
        self.spec = source  # as ``--names`` gave it (load_names): what a repro line repeats
        self.tensors: dict[str, dict] = doc["tensors"]
        self.not_exposed: dict[str, str] = doc.get("not_exposed", {})
        self._prefixes = [re.compile(p) for p in doc.get("prefixes", [])]

    def lookup(self, name: str) -> tuple[str, dict] | None:
        """(the table's key, its entry) for a port's name, layer prefixes removed; None if unknown."""
        if name in self.tensors:
            return name, self.tensors[name]
        for p in self._prefixes:
            stripped = p.sub("", name, count=1)
            if stripped != name and stripped in self.tensors:
                return stripped, self.tensors[stripped]
        return None


def check_table(doc, source: str) -> None:
    """Refuse (:class:`NameTableError`, naming the table and the entry) a table that is not of the format:
    the wrong format or version, an entry neither ``as``, ``split`` nor ``not_comparable``, a target that
    is no stage tensor, a ``transpose`` that is no permutation, a ``width`` neither a positive integer nor
    a shape symbol, a prefix that is no regular expression."""
    if not isinstance(doc, dict):
        raise NameTableError(f"{source}: expected a JSON object, found {type(doc).__name__}")
    if doc.get("format") != NAMES_FORMAT or doc.get("version") != NAMES_VERSION:
        raise NameTableError(f"{source}: expected a name table of format {NAMES_FORMAT!r} version {NAMES_VERSION}, "
                           f"found format {doc.get('format')!r} version {doc.get('version')!r}")
    tensors, prefixes = doc.get("tensors"), doc.get("prefixes", [])
    if not isinstance(tensors, dict) or not all(isinstance(e, dict) for e in tensors.values()):
        raise NameTableError(f"{source}: expected 'tensors' an object of entries (objects), found {_brief(tensors)}")
    if not isinstance(doc.get("not_exposed", {}), dict):
        raise NameTableError(f"{source}: expected 'not_exposed' an object, found {_brief(doc.get('not_exposed'))}")
    if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
        raise NameTableError(f"{source}: expected 'prefixes' a list of regular expressions, found {_brief(prefixes)}")
    for p in prefixes:
        try:
            re.compile(p)
        except re.error as exc:
            raise NameTableError(f"{source}: prefix {p!r} is not a regular expression ({exc})") from None
    for name, entry in tensors.items():
        where = f"{source}: entry {name!r}"
        if "split" in entry:
            parts = entry["split"]
            if not isinstance(parts, list) or not parts or not all(isinstance(t, dict) for t in parts):
                raise NameTableError(f"{where}: expected 'split' a list of parts, found {_brief(parts)}")
            for t in parts:
                _check_target(t, where, split=True)
        else:
            _check_target(entry, where, split=False)
        tr = entry.get("transpose")
        if tr is not None and (not isinstance(tr, list) or sorted(tr) != list(range(len(tr)))
                               or not all(isinstance(a, int) and not isinstance(a, bool) for a in tr)):
            raise NameTableError(f"{where}: expected 'transpose' a permutation of the axes [0, 1, ...], found "
                               f"{_brief(tr)}")


def _check_target(t: dict, where: str, *, split: bool) -> None:
    if "not_comparable" in t:
        if not isinstance(t["not_comparable"], str):
            raise NameTableError(f"{where}: expected 'not_comparable' a reason (a string)")
    elif "as" not in t:
        raise NameTableError(f"{where}: expected 'as', 'split' or 'not_comparable' (docs/names.md)")
    elif not isinstance(t["as"], str) or (t["as"] not in TENSOR_ORDER and t["as"] not in KNOWN_TENSORS
                                                and t["as"] not in KNOWN_EXTRA):
        raise NameTableError(f"{where}: maps to {_brief(t['as'])}, which is not a stage tensor")
    if split:
        w = t.get("width")
        if not (isinstance(w, str) or (isinstance(w, int) and not isinstance(w, bool) and w > 0)):
            raise NameTableError(f"{where}: expected each split part's 'width' a positive integer or a shape symbol, "
                               f"found {_brief(w)}")


def _brief(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_names(spec: str | None) -> NameTable | None:
    """``hf``, ``doppler``, ``metrale`` (the packaged tables) or a path to a table; None for none."""
    if not spec:
        return None
    path = NAMES_DIR / f"{spec}.json" if spec in builtin_tables() else Path(spec)
    if not path.is_file():
        raise NameTableError(f"unknown name table {spec!r}: expected one of {', '.join(builtin_tables())} or the path "
                           f"of a {NAMES_FORMAT} JSON file (docs/names.md)")
    doc = read_json(path, what="name table", error=NameTableError, max_bytes=MAX_TABLE_BYTES)
    table = NameTable(doc, str(path))
    table.spec = spec
    return table


def _split_key(key: str) -> tuple[str, str]:
    """``calls.3.gdn_y`` -> (``calls.3.``, ``gdn_y``); a snapshot file's bare name -> ("", name)."""
    parts = key.split(".", 2)
    if len(parts) == 3 and parts[0] == "calls" and parts[1].isdigit():
        return f"{parts[0]}.{parts[1]}.", parts[2]
    return "", key


class NamedOutputs:
    """A safetensors file read by canonical keys through an optional :class:`NameTable`."""

    def __init__(self, file, table: NameTable | None, dims: dict[str, int] | None):
        self.file, self.table, self.dims = file, table, dims or {}
        self.metadata = file.metadata
        self._alias: dict[str, tuple[str, dict]] = {}  # canonical key -> (port key, conversion)
        self.unknown: list[str] = []
        self.not_comparable: dict[str, str] = {}
        keys = list(file)
        direct = set(keys)
        for key in keys:
            prefix, name = _split_key(key)
            if name in TENSOR_ORDER or name in KNOWN_TENSORS or name in KNOWN_EXTRA:  # both layer kinds
                continue
            hit = table.lookup(name) if table else None
            if hit is None:
                self.unknown.append(name)
                continue
            entry = hit[1]
            if "not_comparable" in entry:
                self.not_comparable[name] = entry["not_comparable"]
                continue
            offset = 0
            total = sum(self._width(p, key) for p in entry["split"]) if "split" in entry else None
            for part in entry.get("split", [entry]):
                width = self._width(part, key) if "split" in entry else None
                conv = {"transpose": entry.get("transpose"), "slice": (offset, offset + width) if width else None,
                        "total": total}
                offset += width or 0
                if "not_comparable" in part:
                    self.not_comparable[name] = part["not_comparable"]
                    continue
                canonical = prefix + part["as"]
                if canonical not in direct and canonical not in self._alias:
                    self._alias[canonical] = (key, conv)

    def _width(self, part: dict, key: str) -> int:
        w = part["width"]
        if isinstance(w, int):
            return w
        if w not in self.dims:
            raise NameTableError(f"name table {self.table.source}: width {w!r} of {key!r} is not a shape symbol "
                               f"({', '.join(sorted(self.dims))})")
        return int(self.dims[w])

    def __contains__(self, key: str) -> bool:
        return key in self.file or key in self._alias

    def source_of(self, key: str) -> str:
        """The port's key a canonical key is read from."""
        return self._alias[key][0] if key not in self.file and key in self._alias else key

    def ref(self, file: str, key: str) -> dict:
        """A record's ``actual_ref``: ``{file, key}``; read through a table, also the port's own key, the
        table and the conversion made (``convert``: ``{transpose, slice, total}``), so that the tensor is
        reloaded as verify judged it without the table (:func:`read_converted`; the report does)."""
        port_key = self.source_of(key)
        if port_key == key:
            return {"file": file, "key": key}
        conv = self._alias[key][1]
        return {"file": file, "key": key, "port_key": port_key, "names": self.table.source,
                "convert": {"transpose": conv["transpose"],
                            "slice": list(conv["slice"]) if conv["slice"] is not None else None,
                            "total": conv["total"]}}

    def dtype_of(self, key: str) -> str:
        return self.file.dtype_of(self.source_of(key))

    def shape_of(self, key: str, shape: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The shape :meth:`read` would return for canonical ``key``, from the file's header alone (so a
        size can be checked before anything is read)."""
        if key in self.file:
            return tuple(self.file.shape_of(key))
        port_key, conv = self._alias[key]
        return converted_shape(self.file.shape_of(port_key), conv, shape)

    def read(self, key: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The array for canonical ``key``, converted (transpose, slice, then reshape to ``shape`` when only
        the layout differs)."""
        if key in self.file:
            return self.file.read(key)
        port_key, conv = self._alias[key]
        return convert(self.file.read(port_key), conv, shape)

    def notes(self) -> list[str]:
        """What the table did not compare and the names it does not know: each note opens with one of
        :data:`NOTE_OPENINGS` (the console says each once for the run, not under every case)."""
        out = []
        if self.not_comparable:
            out.append(NOTE_OPENINGS[0] + (self.table.port if self.table else "?") + " name table): " + "; ".join(
                f"{n}: {why}" for n, why in sorted(self.not_comparable.items())))
        if self.unknown:
            names = sorted(set(self.unknown))
            where = (f"neither the stage vocabulary nor the {self.table.port} name table ({self.table.source})"
                     if self.table else "not in the stage vocabulary (a port's own names need --names "
                     + "|".join(builtin_tables()) + " or a table path)")
            out.append(f"{NOTE_OPENINGS[1]}, {where}: {', '.join(names)}")
        return out


def is_names_note(note: str) -> bool:
    """A case note :meth:`NamedOutputs.notes` wrote (about names, not about the case's numbers)."""
    return note.startswith(NOTE_OPENINGS)


def converted_shape(port_shape, conv: dict, shape: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The shape :func:`convert` gives a tensor of ``port_shape``."""
    s = list(port_shape)
    if conv["transpose"] is not None and len(s) == len(conv["transpose"]):
        s = [s[a] for a in conv["transpose"]]
    if conv["slice"] is not None:
        lo, hi = conv["slice"]
        if not s or s[-1] != conv["total"]:
            return tuple(s)  # a split describes its whole tensor; anything else is another shape
        s[-1] = hi - lo
    if shape is not None and tuple(s) != tuple(shape) and math.prod(s) == math.prod(shape):
        s = list(shape)
    return tuple(s)


def convert(arr, conv: dict, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A port's tensor as the stage tensor it stands for: the axes permuted (``transpose``), the slice of
    the last axis cut (``slice`` of a last axis of ``total``), then reshaped row-major to ``shape`` (the
    golden's) when only the layout differs: a ``split`` part too (metrale's ``[T, Hv]`` half of
    ``gates`` is ``beta`` [B, T, Hv] as it is; its ``[T, key_dim]`` slice of ``l2`` becomes ``q``
    ``[B, T, Hk, dk]``)."""
    arr = np.asarray(arr)
    if conv["transpose"] is not None and arr.ndim == len(conv["transpose"]):
        arr = np.transpose(arr, conv["transpose"])
    if conv["slice"] is not None and arr.ndim >= 1 and arr.shape[-1] == conv["total"]:
        arr = arr[..., conv["slice"][0]:conv["slice"][1]]
    arr = np.ascontiguousarray(arr)
    if shape is not None and tuple(arr.shape) != tuple(shape) and arr.size == math.prod(shape):
        arr = arr.reshape(shape)
    return arr


def recorded_conversion(ref: dict) -> dict | None:
    """The ``convert`` of a summary's ``actual_ref`` (:meth:`NamedOutputs.ref`) checked, since a summary is
    read as untrusted: ``transpose`` a permutation or null, ``slice`` ``[lo, hi]`` inside ``total`` or
    null; None if it is not such (the caller says the tensor cannot be reloaded)."""
    conv = ref.get("convert")
    if not isinstance(conv, dict):
        return None
    tr, sl, total = conv.get("transpose"), conv.get("slice"), conv.get("total")

    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if tr is not None and (not isinstance(tr, list) or not all(whole(a) for a in tr)
                           or sorted(tr) != list(range(len(tr)))):
        return None
    if sl is not None and not (isinstance(sl, list) and len(sl) == 2 and all(whole(v) for v in sl)
                               and whole(total) and 0 <= sl[0] < sl[1] <= total):
        return None
    if total is not None and not whole(total):
        return None
    return {"transpose": tr, "slice": tuple(sl) if sl is not None else None, "total": total}
