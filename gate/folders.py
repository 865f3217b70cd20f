"""The folders the gate writes, and why nothing else is lost or read stale.

The gate owns ``OUT/PROFILE/`` (one outputs folder per profile) and the ``--report`` folder. Each
is marked with a file when the gate makes it; a marked folder is replaced as a whole on the next run
(so no outputs file of an earlier run is ever judged as this run's), an absent or empty one is made,
and a folder that holds anything else is refused before anything runs: it is someone's. ``OUT``
itself, and every folder the gate writes, is never a fixture suite, inside one, or around the one in
use (:func:`gdncheck.fixtures.manifest.refuse_output_in_suite`). The gate's own summary and JUnit
files of an earlier run are removed first, so a run that stops early leaves no stale verdict.

:func:`refuse_gate_writes` is the one check of every path a gate writes (``OUT``, its
``gate-summary.json`` and ``gate-junit.xml``, ``--junit``, ``--report``, ``OUT/PROFILE``): the plain
gate and ``gate --merge`` both call it (the merge with its shard folders as ``inputs``, which no output
may be, lie inside or contain), on top of :mod:`gdncheck.writes`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gdncheck.errors import GDNError
from gdncheck.writes import JUNIT_MARKS, WriteRefused, refuse_replacing, refuse_write, refuse_write_into_suite

OUTPUTS_MARKER = ".gdncheck-gate"
REPORT_MARKER = ".gdncheck-gate-report"
#: the gate's own files in OUT (replaced by the next run, never a user's file of that name)
SUMMARY_NAME = "gate-summary.json"
JUNIT_NAME = "gate-junit.xml"
#: the first bytes of a gate-summary.json gdncheck wrote (gate/summary.py writes it with indent=1)
GATE_SUMMARY_MARKS = (b'"schema": "gdncheck-gate-summary"', b'"schema":"gdncheck-gate-summary"')


class FolderError(GDNError):
    """A folder the gate would write that holds someone else's files."""

    code = "gate_folder"


def check_owned(folder: Path, marker: str, what: str) -> None:
    """Refuse ``folder`` unless it is absent, empty, or marked as the gate's own."""
    if folder.is_symlink():  # never followed: replacing it whole would empty whatever it points at
        raise FolderError(f"{what} {folder} is a symbolic link; expected a folder the gate can make (a link is not "
                          f"followed)")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise FolderError(f"{what} {folder} is a file; expected a folder the gate can make")
    if any(folder.iterdir()) and not (folder / marker).is_file():
        raise FolderError(f"{what} {folder} is not empty and was not written by gdncheck gate (no {marker}): the "
                          f"gate replaces its folders as a whole, so it does not write into this one; remove it or "
                          f"choose another folder")


def fresh(folder: Path, marker: str, what: str) -> Path:
    """``folder`` emptied (a marked one removed whole) and made again, with its marker."""
    check_owned(folder, marker, what)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / marker).write_text("written by gdncheck gate; replaced as a whole by the next run\n")
    return folder


def remove_stale(*files: Path) -> None:
    """Remove earlier results (regular files only) before a run that will write them again."""
    for f in files:
        if f.is_symlink() or f.is_file():
            f.unlink()  # a link itself, never its target


def _refuse_around_inputs(path: Path, what: str, inputs) -> None:
    """``path`` (an output) is none of ``inputs`` (folders read: a merge's shards), lies inside none, and
    contains none: writing there would replace what is being read (a shard's own summaries)."""
    p = path.resolve()
    for folder in inputs:
        f = Path(folder).resolve()
        if p == f or f in p.parents or p in f.parents:
            rel = "is" if p == f else "lies inside" if f in p.parents else "contains"
            raise WriteRefused(f"{what} {path} {rel} the shard folder {folder}, which this merge reads; gdncheck never "
                               f"writes over its own inputs (a shard's summaries would be replaced): choose a "
                               f"folder apart from the shards")


def refuse_gate_writes(out: str | Path, *, fixtures: str | Path | None, junit: str | Path | None = None,
                       report: str | Path | None = None, profiles=(), inputs=()) -> None:
    """Raise (:class:`~gdncheck.writes.WriteRefused`, :class:`FolderError`: exit 2, one line) before
    anything is written unless every path a gate writes may be written: ``out`` and ``report`` no
    fixture suite, inside none and around ``fixtures`` (the suite in use); ``OUT/gate-summary.json``
    and ``OUT/gate-junit.xml`` absent or the gate's own (never a user's file of that name, a link, a
    folder); ``junit`` a new file or a JUnit file gdncheck wrote, outside every suite; ``report`` and
    each ``OUT/PROFILE`` (``profiles``) absent, empty or marked as the gate's; none of them one of
    ``inputs``, inside one or around one (a merge's shard folders)."""
    out = Path(out)
    refuse_write_into_suite(out, "--out", fixtures=fixtures)
    _refuse_around_inputs(out, "--out", inputs)
    if out.exists() and not out.is_dir():
        raise WriteRefused(f"--out {out} is a file; expected a folder the gate can make")
    refuse_replacing(out / SUMMARY_NAME, "--out", GATE_SUMMARY_MARKS, kind="a gate summary gdncheck wrote")
    refuse_replacing(out / JUNIT_NAME, "--out", JUNIT_MARKS, kind="a JUnit file gdncheck wrote")
    if junit:
        if Path(junit).is_dir():
            raise WriteRefused(f"--junit {junit} is a folder; expected the name of a file to write")
        refuse_write(junit, "--junit", JUNIT_MARKS, kind="a JUnit file gdncheck wrote", fixtures=fixtures)
        _refuse_around_inputs(Path(junit), "--junit", inputs)
    if report:
        refuse_gate_report(report, fixtures, inputs, out=out, profiles=profiles)
    for p in profiles:
        check_owned(out / p, OUTPUTS_MARKER, f"the outputs folder of profile {p}")


def refuse_gate_report(report: str | Path, fixtures: str | Path | None, inputs=(), *, out: str | Path | None = None,
                       profiles=()) -> None:
    """The ``--report`` folder: no fixture suite, inside none, around none (``fixtures``), none of
    ``inputs``, not ``out`` nor around it nor in one of its ``OUT/PROFILE`` folders (each replaced
    whole: one would remove the other), and absent, empty or the gate's own (its marker)."""
    refuse_write_into_suite(report, "--report", fixtures=fixtures)
    _refuse_around_inputs(Path(report), "--report", inputs)
    if out is not None:
        r, o = Path(report).resolve(), Path(out).resolve()
        if r == o or r in o.parents or any(r == (o / p).resolve() or (o / p).resolve() in r.parents
                                           for p in profiles):
            raise WriteRefused(f"--report {report} is, contains or lies in a folder of --out {out}; the gate replaces "
                               f"its report folder whole, so it would remove its own results: choose a folder of "
                               f"its own (OUT/report is one)")
    check_owned(Path(report), REPORT_MARKER, "--report")
