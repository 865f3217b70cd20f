"""Names and strings gdncheck does not trust: file names read from a fixture folder, an outputs
folder, a name table or a summary, and any text a port supplied.

- `safe_path`: a name from a file is a path *inside* its folder (never absolute, no `..`, no link
  out, never a device, pipe or socket); every reader and writer of such a name goes through it.
- `safe_text`: a string from a port is printed as one line of visible characters (controls and
  invisible Unicode controls shown as escapes), so no string can forge a verdict line.
- `read_json`: the one reader of an untrusted JSON file (bounded, `loads_untrusted`: a key twice
  refused; every failure one line of the caller's error class).
- `folder_lock`: one writer per folder; a second is refused with one line naming the first.

The promises these keep and every bad input: docs/bad-inputs.md.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from collections.abc import Callable
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
            # read(n) allocates n bytes first: the size fstat gave, and the rest up to the limit only if it grew
            data = fh.read(size + 1)
            if len(data) > size:
                data += fh.read(limit + 1 - len(data))
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


#: The largest JSON file :func:`read_json` reads unless told otherwise (a verify summary of a large
#: suite is a few MB; ``gdncheck report`` allows a summary this much).
MAX_JSON_BYTES = 1 << 30


def read_json(path: str | os.PathLike, *, what: str, error: Callable[[str], Exception],
              max_bytes: int = MAX_JSON_BYTES, missing: str | None = None, unreadable: str | None = None,
              with_raw: bool = False):
    """The JSON document of the untrusted file ``path`` (a manifest, a summary, a name or tolerance
    table), else ``error(message)``: one line, ``PATH: expected a JSON WHAT, found ...``.

    The file is read by :func:`read_bounded` (a regular file of at most ``max_bytes``; a device, a
    pipe or a folder refused unread) and parsed by :func:`loads_untrusted`. ``what`` names the
    document without an article (``"verify summary"``); ``missing`` replaces the message for a file
    that does not exist (default ``PATH: expected a WHAT, found nothing``), ``unreadable`` the words
    before ``(why)`` for content that is no JSON (default ``expected a JSON WHAT, found unreadable
    content``). ``with_raw``: ``(document, the bytes read)`` (for a caller that hashes the file)."""
    try:
        raw = read_bounded(path, max_bytes, what)
        doc = loads_untrusted(raw)  # a key twice: refused; lone surrogates replaced
    except FileNotFoundError:
        raise error(missing or f"{path}: expected {_article(what)}, found nothing") from None
    except UnsafePathError as exc:  # not a regular file, or too large
        raise error(str(exc)) from None
    except RecursionError:
        raise error(f"{path}: expected a JSON {what}, found JSON nested too deep") from None
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8 (a ValueError), not JSON, a key twice
        raise error(f"{path}: {unreadable or f'expected a JSON {what}, found unreadable content'} ({exc})") from None
    return (doc, raw) if with_raw else doc


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


# --- one writer per folder -----------------------------------------------------------------------

#: The lock file a writing command holds in a folder it writes (removed when it is done).
LOCK_NAME = ".gdncheck.lock"
#: A lock file beside a folder that is replaced as a whole (a report, a fixture suite being built):
#: ``.NAME.gdncheck.lock`` in its parent.
LOCK_SUFFIX = ".gdncheck.lock"


class FolderBusyError(GDNError):
    """A folder another gdncheck process is writing (it holds the folder's lock)."""

    code = "folder_busy"


def lock_file_of(folder: str | os.PathLike, *, beside: bool = False) -> Path:
    """Where the lock of ``folder`` lives: ``FOLDER/.gdncheck.lock``, or (``beside``: a folder that is
    replaced as a whole, or must be empty) ``PARENT/.NAME.gdncheck.lock``."""
    folder = Path(folder)
    if beside:
        return folder.absolute().parent / f".{folder.absolute().name}{LOCK_SUFFIX}"
    return folder / LOCK_NAME


def is_lock_name(name: str) -> bool:
    """Whether ``name`` (a file name inside a folder) is that of a gdncheck lock file."""
    return name == LOCK_NAME or (name.startswith(".") and name.endswith(LOCK_SUFFIX))


def _holder(text: str) -> dict:
    try:
        doc = loads_untrusted(text)
    except (ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _describe(holder: dict) -> str:
    pid, command, started = holder.get("pid"), holder.get("command"), holder.get("started")
    if not isinstance(pid, int):
        return ("another gdncheck process (a reader, such as a verify of the folder, or a writer that has not "
                "written its pid yet)")
    return (f"gdncheck process {pid} ({one_line(command, 300) if isinstance(command, str) else 'command unknown'}"
            + (f", since {one_line(started, 40)}" if isinstance(started, str) else "") + ")")


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process, alive
        return True
    return True


def _open_for_reading(path: Path, exc: OSError) -> int | None:
    """A read-only descriptor of the lock file ``path`` a reader could not open for writing (``exc``:
    a read-only folder or file): the descriptor; None when no lock file is there; -1 when the
    failure was another one (the caller raises it)."""
    import errno

    if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
        return -1
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError:
        return -1


class FolderLock:
    """The lock of one folder, held by this process (:func:`folder_lock`)."""

    def __init__(self, folder: Path, path: Path, fd: int, note: str | None, shared: bool = False):
        self.folder, self.path, self._fd, self.note, self.shared = folder, path, fd, note, shared

    def release(self) -> None:
        if self._fd < 0:
            return
        import fcntl

        if self.shared:  # a reader removes the lock file only when no other reader holds it (it alone then)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # another reader holds it: it stays, and the last one out removes it
                os.close(self._fd)
                self._fd = -1
                return
        try:  # removed first (if still ours), so that a process that opened it before sees it gone
            st, mine = os.stat(self.path, follow_symlinks=False), os.fstat(self._fd)
            if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                os.unlink(self.path)
        except OSError:
            pass
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def folder_lock(folder: str | os.PathLike, what: str = "folder", *, command: str | None = None,
                beside: bool = False, note=None, shared: bool = False) -> FolderLock:
    """Take the lock of ``folder`` (one writer per folder), or raise :class:`FolderBusyError`: another
    process holds it (one line naming that process's pid, its command, and the folder).

    The lock is ``fcntl.flock`` on :func:`lock_file_of` (made, with the folder when ``beside`` is
    False; the parent when True), which holds the pid, the command and the start time of its holder
    and is removed on :meth:`FolderLock.release` (a context manager: ``with folder_lock(out): ...``).
    The kernel releases a lock whose process ended, so a lock file left by a process that was killed
    is taken over; ``note(text)`` (default: a line on stderr) is told so. Where ``fcntl`` does not
    exist (Windows) nothing is locked.

    ``shared``: a reader's lock (``verify`` of an outputs folder): any number of readers hold it at
    once, and a writer is excluded while one does (and a reader while a writer does). A reader writes
    no holder record, and the last reader out removes the lock file. In a folder the reader may not
    write (read-only), an existing lock file is locked through a read-only descriptor, and where
    none exists none can be made: nothing is locked (no process of this user writes there either)."""
    import json
    import shlex
    import sys
    import time

    folder = Path(folder)
    path = lock_file_of(folder, beside=beside)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no advisory locks of this kind
        return FolderLock(folder, path, -1, None)
    if command is None:
        command = shlex.join(["gdncheck", *sys.argv[1:]]) if sys.argv and sys.argv[0] else "gdncheck"
    if not shared or not path.parent.is_dir():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UnsafePathError(f"cannot use {what} {folder}: {exc.strerror or exc}") from None
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(20):  # retried only when the file was removed (released) between open and flock
        try:
            fd = os.open(path, flags, 0o666)
        except OSError as exc:
            fd = _open_for_reading(path, exc) if shared else -1
            if fd is None:  # a read-only folder without a lock file: nobody can be writing it through one
                return FolderLock(folder, path, -1, None, shared=True)
            if fd < 0:
                raise UnsafePathError(f"cannot lock {what} {folder}: {path} {exc.strerror or exc} (expected "
                                      f"gdncheck's own lock file, or nothing, there)") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UnsafePathError(f"cannot lock {what} {folder}: {path} is not a regular file")
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
                doing = "being written" if isinstance(holder.get("pid"), int) else "in use"
                raise FolderBusyError(f"{what} {folder} is {doing} by {_describe(holder)}: one writer per "
                                      f"folder; wait for it to finish, or choose another folder") from None
            st, mine = os.stat(path, follow_symlinks=False), os.fstat(fd)
        except FileNotFoundError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
            os.close(fd)  # released and removed by its holder after we opened it: take the new one
            continue
        break
    else:  # pragma: no cover - 20 holders in a row
        raise FolderBusyError(f"{what} {folder}: its lock changed hands 20 times while taken; try again")
    if shared:  # readers leave no record: the file may be read-only, and many hold it at once
        return FolderLock(folder, path, fd, None, shared=True)
    try:
        left = _holder(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        message = None
        if left:
            gone = "which is gone" if not _alive(left.get("pid")) else "which no longer holds it"
            message = (f"note: took over the lock of {what} {folder} left by {_describe(left)}, {gone} (it stopped "
                       f"without releasing it; what it wrote there may be incomplete)")
            (note or (lambda text: print(safe_text(text), file=sys.stderr)))(message)
        record = {"pid": os.getpid(), "command": no_surrogates(command),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
    except BaseException:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        raise
    return FolderLock(folder, path, fd, message)
