"""Structural mutations of the files a port or a suite hands gdncheck, as Hypothesis strategies.

Each strategy draws a *mutation*: a labelled function that changes one file (or the file's kind) in
place. They are structural, not random bytes only: a JSON value of any type put at any key of a
safetensors header or a manifest, shapes, dtypes and offsets out of range or of the wrong type,
the header length, a truncation, and a file replaced by a folder, a link out, a link to a device, a
dangling link or a pipe.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from .sandbox import TOP

#: JSON values of every type, with the numbers a reader must survive
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.sampled_from([0, 1, -1, 2 ** 31, 2 ** 63, 10 ** 30, 10 ** 300]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["F32", "F64", "BF16", "I64", "gdncheck-outputs", "1", "99", "../x", TOP + "/abs.safetensors",
                     "stage_isolated", "end_to_end", "0", "-1", "a\r\x1b[2K\n"]),
)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=4)), max_leaves=8)
#: values of the wrong JSON type (each branch as likely as a value of the right type)
WRONG_TYPES = st.one_of(st.lists(JSON_SCALARS, max_size=3), st.dictionaries(st.text(max_size=4), JSON_SCALARS,
                                                                            max_size=3),
                        st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6))
DTYPES = st.one_of(st.sampled_from(["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "U16", "U32",
                                    "U64", "BOOL", "f32", "F128", ""]), WRONG_TYPES)
SHAPES = st.one_of(st.lists(st.integers(min_value=-2, max_value=2 ** 62), max_size=5),
                   st.lists(st.sampled_from([0, 1, 2, 3, 16, 2 ** 40 + 1, 10 ** 30]), max_size=20),
                   st.lists(st.one_of(st.booleans(), st.floats(), st.text(max_size=2)), min_size=1, max_size=3),
                   WRONG_TYPES)
OFFSETS = st.one_of(st.lists(st.integers(min_value=-5, max_value=2 ** 64), min_size=2, max_size=2),
                    st.lists(st.integers(min_value=0, max_value=4096), max_size=3),
                    st.lists(st.one_of(st.booleans(), st.floats(), st.text(max_size=2)), min_size=2, max_size=2),
                    WRONG_TYPES)
#: the kinds of :func:`safetensors_mutations`
HEADER_KINDS = ("field", "entry")
META_KINDS = ("meta",)
BYTE_KINDS = ("length", "bytes", "truncate", "deep")
ALL_KINDS = (*HEADER_KINDS, *META_KINDS, *BYTE_KINDS, "file_kind")
META_KEYS = ["format", "format_version", "case", "mode", "fixture_sha256", "implementation", "error_code",
             "error_message", "error_step", "not_applicable", "not_applicable_step", "command"]


@dataclass(frozen=True)
class Mutation:
    label: str
    apply: Callable[[Path], None]

    def __repr__(self) -> str:  # what Hypothesis prints for a falsifying draw
        return f"Mutation({self.label})"


def read_header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_header(path: Path, header, body: bytes) -> None:
    text = json.dumps(header, allow_nan=True).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def _on_header(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        header, body = read_header(path)
        change(header)
        write_header(path, header, body)

    return apply


def _tensor(header: dict, i: int) -> str:
    names = sorted(k for k in header if k != "__metadata__")
    return names[i % len(names)]


@st.composite
def safetensors_mutations(draw, kinds: tuple[str, ...] = ALL_KINDS) -> Mutation:
    """One structural change of one of ``kinds`` to a safetensors file (outputs or snapshot)."""
    kind = draw(st.sampled_from(kinds))
    i = draw(st.integers(min_value=0, max_value=10 ** 6))
    if kind == "field":
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "extra", "drop"]))
        value = draw({"dtype": DTYPES, "shape": SHAPES, "data_offsets": OFFSETS}.get(field, JSON_VALUES))

        def change(h):
            entry = h[_tensor(h, i)]
            if field == "drop":
                entry.pop(sorted(entry)[i % len(entry)], None)
            else:
                entry[field if field != "extra" else "x"] = value

        return Mutation(f"{field} of tensor #{i} = {value!r}"[:200], _on_header(change))
    if kind == "meta":
        key = draw(st.sampled_from(META_KEYS))
        value = draw(st.one_of(st.none(), st.text(max_size=8), st.sampled_from(
            ["1", "99", "0", "3", "-1", "", "x", "stage_isolated", "gdncheck-outputs", "input_error"])))

        def change(h):
            meta = h.setdefault("__metadata__", {})
            if value is None:
                meta.pop(key, None)
            else:
                meta[key] = value

        return Mutation(f"metadata {key} = {value!r}", _on_header(change))
    if kind == "entry":
        value = draw(JSON_VALUES)
        where = draw(st.sampled_from(["tensor", "metadata", "new", "header"]))

        def change(h):
            if where == "tensor":
                h[_tensor(h, i)] = value
            elif where == "metadata":
                h["__metadata__"] = value
            elif where == "new":
                h[f"calls.0.{i % 7}"] = value
            else:
                h.clear()
                h["__metadata__"] = {"format": "gdncheck-outputs"}

        return Mutation(f"{where} entry = {value!r}"[:200], _on_header(change))
    if kind == "length":
        n = draw(st.one_of(st.integers(min_value=0, max_value=2 ** 64 - 1), st.sampled_from([0, 1, 7, 8, 2 ** 27])))

        def apply(path: Path) -> None:
            data = path.read_bytes()
            path.write_bytes(struct.pack("<Q", n) + data[8:])

        return Mutation(f"header length = {n}", apply)
    if kind == "bytes":
        flips = draw(st.lists(st.tuples(st.integers(min_value=0, max_value=10 ** 7), st.integers(1, 255)),
                              min_size=1, max_size=4))

        def apply(path: Path) -> None:
            data = bytearray(path.read_bytes())
            for at, x in flips:
                data[at % len(data)] ^= x
            path.write_bytes(bytes(data))

        return Mutation(f"bytes flipped at {flips}", apply)
    if kind == "deep":
        depth = draw(st.integers(min_value=2, max_value=200000))
        where = draw(st.sampled_from(["top", "entry", "metadata"]))

        def apply(path: Path) -> None:
            header, body = read_header(path)
            nested = b"[" * depth + b"]" * depth
            text = json.dumps(header).encode()
            if where == "top":
                text = text[:-1] + b', "deep": ' + nested + b"}"
            elif where == "entry":
                text = text[:-1] + b', "calls.0.deep": {"dtype": ' + nested + b', "shape": [], "data_offsets": [0, 0]}}'
            else:
                text = b'{"__metadata__": {"format": ' + nested + b"}}"
            text += b" " * (-len(text) % 8)
            path.write_bytes(struct.pack("<Q", len(text)) + text + body)

        return Mutation(f"JSON nested {depth} deep at {where}", apply)
    if kind == "truncate":
        keep = draw(st.floats(min_value=0, max_value=1.2))

        def apply(path: Path) -> None:
            data = path.read_bytes()
            n = int(len(data) * keep)
            path.write_bytes(data[:n] if n <= len(data) else data + b"\0" * (n - len(data)))

        return Mutation(f"truncated to {keep:.2f} of its length", apply)
    return draw(file_kind_mutations())


@st.composite
def file_kind_mutations(draw) -> Mutation:
    """The file replaced by something that is not a regular file inside its folder."""
    kind = draw(st.sampled_from(["folder", "link_out", "link_device", "link_dangling", "pipe", "empty",
                                 "link_folder"]))

    def apply(path: Path) -> None:
        outside = path.parent.parent / "outside"
        path.unlink()
        if kind == "folder":
            path.mkdir()
            (path / "x").write_bytes(b"x")
        elif kind == "link_out":
            path.symlink_to(outside / "sentinel.safetensors")
        elif kind == "link_device":
            path.symlink_to("/dev/zero")
        elif kind == "link_dangling":
            path.symlink_to(outside / "nothing-here")
        elif kind == "link_folder":
            path.symlink_to(outside)
        elif kind == "pipe":
            os.mkfifo(path)
        else:
            path.write_bytes(b"")

    return Mutation(f"file replaced by {kind}", apply)


def _write_manifest(path: Path, doc: dict) -> None:
    """Write a mutated manifest, the placeholder ``TOP`` made the draw's own temporary folder
    (``path`` is TOP/a/b/fixtures/manifest.json, :mod:`.sandbox`)."""
    text = json.dumps(doc, allow_nan=True)
    path.write_text(text.replace(TOP, json.dumps(str(path.parents[3]))[1:-1]))


def _paths(value, prefix=()) -> list[tuple]:
    """Every key path inside a JSON value (dict keys and list indices)."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for j, v in enumerate(value):
            out += _paths(v, (*prefix, j))
    return out


#: file names that try to leave their folder, or are no file name at all
HOSTILE_NAMES = st.one_of(st.sampled_from(["../x.safetensors", "../../outside/sentinel.safetensors", TOP + "/x",
                                           "/dev/null", "a/../../x", "./x", "x/", "", ".", "..", "a\\..\\x",
                                           "C:/x", "a\x00b", "\x1b[2K", "sub/x.safetensors", "outside"]),
                          st.text(max_size=12))


@st.composite
def snapshot_name_mutations(draw) -> Mutation:
    """Every save/load step's file name replaced by a hostile name (the same one: the program stays
    consistent, so the name itself is what is judged)."""
    name = draw(HOSTILE_NAMES)

    def apply(path: Path) -> None:
        doc = json.loads(path.read_text())
        for c in doc["cases"]:
            for step in c["program"]:
                if step["op"] in ("save", "load"):
                    step["file"] = name
        _write_manifest(path, doc)

    return Mutation(f"snapshot file names = {name!r}", apply)


@st.composite
def manifest_mutations(draw, case_index: int) -> Mutation:
    """A JSON value of any type put at any key path of one case entry of a manifest (or that key
    removed); ``case_index`` is the entry hit. The path is drawn among the entry's own fields, its
    program's, or anywhere in it, so each part of the entry is hit as often."""
    pick = draw(st.integers(min_value=0, max_value=10 ** 6))
    where = draw(st.sampled_from(["field", "program", "anywhere"]))
    remove = draw(st.booleans())
    value = draw(st.one_of(JSON_VALUES, st.sampled_from([None, 0, 1, -1, 10 ** 9, "error", "forward", [], {}])))

    def apply(path: Path) -> None:
        doc = json.loads(path.read_text())
        entry = doc["cases"][case_index]
        paths = _paths(entry)[1:]
        if where == "field":
            paths = [p for p in paths if len(p) == 1]
        elif where == "program":
            paths = [p for p in paths if p[0] == "program" and len(p) >= 2] or paths
        at = paths[pick % len(paths)]
        parent = entry
        for k in at[:-1]:
            parent = parent[k]
        if remove and isinstance(parent, dict):
            del parent[at[-1]]
        else:
            parent[at[-1]] = value
        _write_manifest(path, doc)

    return Mutation(f"case {case_index}, {where} key path #{pick}: {'removed' if remove else repr(value)}"[:200],
                    apply)
