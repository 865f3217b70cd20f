"""Names and strings gdncheck does not trust: file names read from a fixture folder, an outputs
folder, a name table or a summary, and any text a port supplied.

Two rules, one function each, used by every command:

- :func:`safe_path` — a name from a file is a path *inside* the folder it belongs to: never absolute,
  no ``..``, no link that leads out, and (when it exists) a regular file or folder, never a device,
  a pipe or a socket. Every reader and writer of such a name goes through it (``run``, ``gate``,
  ``verify``, ``fixtures check|build``, ``report``, the program executor's snapshot files).
- :func:`safe_text` — a string from a port (an error message, an implementation name, a tensor
  name, a reason) is printed as one line of visible characters: control characters (carriage
  returns, ANSI escape sequences, backspaces, line breaks) and the invisible Unicode controls that
  reorder or hide text are shown as escapes (``\\x1b``, ``\\r``, ``\\u202e``), so no string can
  forge, overwrite or hide a verdict line.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from pathlib import Path, PurePosixPath

from .errors import GDNError


class UnsafePathError(GDNError):
    """A file name that would lead outside its folder, or to something that is not a regular file."""

    code = "unsafe_path"


# C0 and C1 controls, DEL, the line and paragraph separators, and the Unicode format controls that
# reorder or hide text (bidirectional embeddings, overrides and isolates; zero-width marks; BOM), and
# lone surrogates (no UTF-8 writer can write one: a print, an HTML or XML file would fail on it)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")
_UNSAFE_KEEP_NL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
                             "\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match) -> str:
    ch = m.group(0)
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def safe_text(value: object, *, keep_newlines: bool = False) -> str:
    """``value`` as printable text: every control character shown as an escape (``\\x1b``, ``\\r``).

    ``keep_newlines`` keeps ``\\n`` (for a block gdncheck composed line by line itself); every string a
    port supplied is passed without it, so that it stays on its one line."""
    return (_UNSAFE_KEEP_NL if keep_newlines else _UNSAFE).sub(_escape, str(value))


#: the longest line :func:`one_line` prints (a message quoting a file's content could be megabytes)
MAX_LINE = 2000


def one_line(value: object, limit: int = MAX_LINE) -> str:
    """:func:`safe_text` of ``value``, cut in the middle to at most about ``limit`` characters: a
    message that quotes what it found in a file stays one readable line, whatever the file held."""
    text = safe_text(value)
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]} ... ({len(text) - 2 * keep} characters left out) ... {text[-keep:]}"


def check_name(name: object, what: str = "file") -> str:
    """``name`` if it is a usable relative file name (the lexical rules of :func:`safe_path`), else
    :class:`UnsafePathError`: a string, not empty, not absolute, no ``..`` or empty component, no
    backslash (a Windows separator), no control character."""
    if not isinstance(name, str) or not name:
        raise UnsafePathError(f"{what} name must be a non-empty relative path, found {name!r}")
    if name != safe_text(name) or "\\" in name:
        raise UnsafePathError(f"{what} name {name!r} holds a control character or a backslash; expected a relative "
                              f"path with '/' separators")
    parts = name.split("/")
    if name.startswith("/") or PurePosixPath(name).is_absolute() or re.match(r"^[A-Za-z]:", name):
        raise UnsafePathError(f"{what} name {name!r} is absolute: it points outside its folder; expected a path "
                              f"relative to it")
    if ".." in parts:
        raise UnsafePathError(f"{what} name {name!r} points outside its folder ('..'); expected a path inside it")
    if any(p in ("", ".") for p in parts):
        raise UnsafePathError(f"{what} name {name!r} has an empty or '.' component; expected a plain relative path")
    return name


def safe_path(directory: str | os.PathLike, name: object, what: str = "file", *, kind: str = "file") -> Path:
    """``directory / name``, refused (:class:`UnsafePathError`) unless it stays inside ``directory``.

    The name obeys :func:`check_name`; the path, links resolved, lies inside ``directory`` (links
    resolved too); and if something is there, it is of ``kind`` (``"file"``: a regular file,
    ``"dir"``: a folder, ``"any"``: a regular file or a folder) — never a device, a pipe or a socket.
    Nothing need exist: a writer calls it for the file it is about to write."""
    check_name(name, what)
    root = Path(directory).resolve()
    path = (root / str(name)).resolve()
    if path != root and root not in path.parents:
        raise UnsafePathError(f"{what} name {name!r} points outside {root} (to {path}, through a link)")
    if path == root:
        raise UnsafePathError(f"{what} name {name!r} names the folder {root} itself")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise UnsafePathError(f"{what} {path} cannot be examined: {exc.strerror or exc}") from None
    found = _kind_of(mode)
    wanted = {"file": ("file",), "dir": ("folder",), "any": ("file", "folder")}[kind]
    if found not in wanted:
        expected = " or ".join(_article(w) for w in wanted)
        raise UnsafePathError(f"{what} {path} is {_article(found)}, expected {expected}")
    return path


def read_bounded(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path`` (links followed: a path given on the command line), at most
    ``limit`` of them, else :class:`UnsafePathError`: a device (``/dev/zero`` never ends), a pipe (it
    may never be written), a folder or a file over ``limit`` is refused before anything is read.
    ``FileNotFoundError`` is left to the caller, who knows what a missing file means."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a pipe's open must not wait for a writer
    try:
        mode, size = os.fstat(fd).st_mode, os.fstat(fd).st_size
        if not stat.S_ISREG(mode):
            raise UnsafePathError(f"{what} {path} is {_article(_kind_of(mode))}, expected a file")
        if size > limit:
            raise UnsafePathError(f"{what} {path}: expected at most {limit} bytes, found {size}")
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read(limit + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:  # grew while read
        raise UnsafePathError(f"{what} {path}: expected at most {limit} bytes, found more")
    return data


#: A lone UTF-16 surrogate: JSON's "\\udc80" decodes to one, and no UTF-8 writer can write it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def no_surrogates(value):
    """``value`` with every string in it (keys too, at any depth) free of lone surrogates, each one
    replaced by U+FFFD: what a file said stays readable, and no later print, HTML, XML or JSON write
    can fail on it (a string from a file is made safe once, where it enters)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {no_surrogates(k): no_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [no_surrogates(v) for v in value]
    return value


def loads_untrusted(raw: bytes | str):
    """The JSON document of an untrusted file (a port's outputs header, a manifest, a summary, a name
    or tolerance table): a key given twice refused (:class:`DuplicateKeyError`), every string freed
    of lone surrogates (:func:`no_surrogates`). Raises ``ValueError`` (``UnicodeDecodeError``,
    ``json.JSONDecodeError``, :class:`DuplicateKeyError`) or ``RecursionError`` as ``json.loads`` does."""
    import json

    text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
    return no_surrogates(json.loads(text, object_pairs_hook=no_duplicate_keys))


class DuplicateKeyError(ValueError):
    """A JSON object that names a key twice (raised by :func:`no_duplicate_keys`)."""


def no_duplicate_keys(pairs: list) -> dict:
    """``object_pairs_hook`` for ``json.loads`` of an untrusted file: an object naming a key twice is
    refused (:class:`DuplicateKeyError`, a ``ValueError``) instead of silently keeping the last value
    (which another reader, keeping the first, would disagree with)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(f"expected every key of a JSON object once, found {one_line(key, 200)!r} twice")
        out[key] = value
    return out


def _kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISFIFO(mode):
        return "pipe"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def _article(kind: str) -> str:
    return f"a {kind}" if kind[0] not in "aeiou" else f"an {kind}"


def is_within(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (both with links resolved)."""
    p, f = Path(path).resolve(), Path(folder).resolve()
    return p == f or f in p.parents


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser for every gdncheck command line (``gdncheck``, ``python -m`` entry points):
    a usage error is one line on stderr and exit 2 — what was wrong, and where the full usage is —
    instead of argparse's usage block before it. Subcommands' parsers are of this class too
    (``add_subparsers`` takes the parent's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {safe_text(message)} (usage: {self.prog} --help)\n")
