"""Where a gdncheck command may write: never into a fixture suite, never over a file it did not make.

Every output path a command takes (a folder it fills or replaces, a file it writes, a file it appends
to) goes through one of these before anything is written, and a refusal is :class:`WriteRefused`
(exit 2, one line naming the flag, the path and what was found):

- :func:`refuse_write_into_suite` ``(path, what, fixtures=None)``: ``path`` (links resolved) is no
  fixture suite and lies inside none — a suite is a folder whose ``manifest.json`` is of format
  ``gdncheck-fixtures``: the committed ``fixtures/default`` of a checkout, the suite the wheel
  ships, one a user built or vendored — nor inside the installed gdncheck package
  (:func:`gdncheck.installed.refuse_write_into_package`); with ``fixtures`` (the suite in use), a
  folder written as a whole must not contain it either.
- :func:`refuse_replacing` ``(path, what, marks)``: if something is at ``path`` it is a regular file
  gdncheck made, recognised by one of ``marks`` (byte strings, one of which the file's first
  :data:`MARK_BYTES` bytes hold: the ``"schema": "gdncheck-verify-summary"`` of a summary, the
  ``<testsuites name="gdncheck`` of a JUnit file, ...). A file of the user's (a README, a manifest,
  a golden) is never replaced or removed as "stale". An empty file holds nothing to lose: it is
  replaced (``--summary "$(mktemp)"``).
- :func:`refuse_write` ``(path, what, marks=None, fixtures=None)``: both; the one call a writer
  of a single file makes (``marks=None``: a file that is appended to, or that must not exist).

The "file we made" policy: a file gdncheck writes carries a mark in its first bytes (a JSON
``schema`` or ``format`` naming gdncheck, an XML root naming it, a marker file in a folder it
replaces whole, such as ``.gdncheck-report``); only such a file is replaced. Appending (``report
--markdown`` to a CI job summary file) never replaces, so only the suite rule applies. The marks a
command accepts are listed beside it (docs/bad-inputs.md, "Writes").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import GDNError

#: the file that makes a folder a fixture suite, and the format it names (fixtures/FORMAT.md §2)
MANIFEST_NAME = "manifest.json"
SUITE_FORMAT = "gdncheck-fixtures"
#: how much of a file's start is read for its mark (a manifest's format, a summary's schema)
MARK_BYTES = 4096

#: marks of the files gdncheck writes, by kind (the first bytes of the file hold one of them)
VERIFY_SUMMARY_MARKS = (b'"schema": "gdncheck-verify-summary"', b'"schema":"gdncheck-verify-summary"')
JUNIT_MARKS = (b'<testsuites name="gdncheck',)


class WriteRefused(GDNError):
    """An output path that lies in a fixture suite, or holds a file gdncheck did not make."""

    code = "write_refused"


def is_suite(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a fixture suite: a regular ``manifest.json`` whose first bytes name
    the format ``gdncheck-fixtures`` (a damaged or schema-breaking suite is a suite all the same)."""
    path = Path(folder) / MANIFEST_NAME
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as fh:
            return SUITE_FORMAT.encode() in fh.read(MARK_BYTES)
    except OSError:
        return False


def suite_around(path: str | os.PathLike) -> Path | None:
    """The fixture suite ``path`` is or lies inside (links resolved), else None."""
    resolved = Path(path).resolve()
    for folder in (resolved, *resolved.parents):
        if is_suite(folder):
            return folder
    return None


def refuse_write_into_suite(path: str | os.PathLike, what: str, *, fixtures: str | os.PathLike | None = None,
                            builds_suite: bool = False) -> None:
    """Raise :class:`WriteRefused` if ``path`` (a file or folder a command will write, append to or
    replace) is a fixture suite or lies inside one, lies inside the installed gdncheck package, or
    (``fixtures``: the suite in use) contains ``fixtures``. ``builds_suite``: ``path`` is a suite
    folder the command builds (``fixtures build``, ``fixtures export``): it may be a suite itself,
    but never one inside another suite."""
    from .installed import InstalledPackageError, refuse_write_into_package

    suite = suite_around(Path(path).resolve().parent if builds_suite else path)
    if suite is not None:
        where = "is" if suite == Path(path).resolve() else f"lies inside {suite}, which is"
        raise WriteRefused(f"{what} {path} {where} a fixture suite (its manifest.json is of format {SUITE_FORMAT}); "
                           f"gdncheck never writes into one (it could replace its manifest or goldens): choose a "
                           f"path outside it")
    try:
        refuse_write_into_package(path, what)
    except InstalledPackageError as exc:
        raise WriteRefused(str(exc)) from None
    if fixtures is not None:
        p, f = Path(path).resolve(), Path(fixtures).resolve()
        if p == f or p in f.parents:
            raise WriteRefused(f"{what} {path} contains the fixture folder {fixtures}; gdncheck never writes around "
                               f"a suite (it could replace its goldens): choose another path")


def made_by_gdncheck(path: str | os.PathLike, marks: tuple[bytes, ...]) -> bool:
    """Whether the regular file ``path`` starts (its first :data:`MARK_BYTES` bytes) with one of ``marks``."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(MARK_BYTES)
    except OSError:
        return False
    return any(m in head for m in marks)


def refuse_replacing(path: str | os.PathLike, what: str, marks: tuple[bytes, ...] | None, *,
                     kind: str = "a file gdncheck wrote") -> None:
    """Raise :class:`WriteRefused` unless nothing is at ``path`` or it is a regular file gdncheck made
    (``marks``: see :func:`made_by_gdncheck`; None: nothing may be there). A link is never followed to
    what it points at."""
    p = Path(path)
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise WriteRefused(f"{what} {path}: cannot examine it ({exc.strerror or exc})") from None
    if stat.S_ISLNK(mode):
        raise WriteRefused(f"{what} {path} is a symbolic link; expected a new file or {kind} (a link is not "
                           f"followed: writing through it replaces whatever it points at)")
    if stat.S_ISDIR(mode):
        raise WriteRefused(f"{what} {path} is a folder; expected the name of a file to write")
    if not stat.S_ISREG(mode):
        raise WriteRefused(f"{what} {path} is not a regular file (a device, a pipe or a socket); expected the name "
                           f"of a file to write")
    if os.lstat(p).st_size == 0:  # an empty file (a mktemp's) holds nothing to lose
        return
    if marks is None or not made_by_gdncheck(p, marks):
        raise WriteRefused(f"{what} {path} exists and is not {kind}: gdncheck never replaces a file it did not "
                           f"make; choose a new path, or remove the file first")


def refuse_write(path: str | os.PathLike, what: str, marks: tuple[bytes, ...] | None = None, *,
                 kind: str = "a file gdncheck wrote", fixtures: str | os.PathLike | None = None,
                 append: bool = False) -> Path:
    """``path`` as a Path if a command may write it: :func:`refuse_write_into_suite`, then (unless
    ``append``: appending replaces nothing) :func:`refuse_replacing`. The one call of a writer of a
    single file."""
    refuse_write_into_suite(path, what, fixtures=fixtures)
    if not append:
        refuse_replacing(path, what, marks, kind=kind)
    return Path(path)
