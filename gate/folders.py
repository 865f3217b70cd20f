"""The folders the gate writes, and why nothing else is lost or read stale.

The gate owns ``OUT/PROFILE/`` (one outputs folder per profile) and the ``--report`` folder. Each
is marked with a file when the gate makes it; a marked folder is replaced as a whole on the next run
(so no outputs file of an earlier run is ever judged as this run's), an absent or empty one is made,
and a folder that holds anything else is refused before anything runs: it is someone's. ``OUT``
itself, and every folder the gate writes, is never a fixture suite, inside one, or around the one in
use (:func:`gdncheck.fixtures.manifest.refuse_output_in_suite`). The gate's own summary and JUnit
files of an earlier run are removed first, so a run that stops early leaves no stale verdict.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gdncheck.errors import GDNError

OUTPUTS_MARKER = ".gdncheck-gate"
REPORT_MARKER = ".gdncheck-gate-report"


class FolderError(GDNError):
    """A folder the gate would write that holds someone else's files."""

    code = "gate_folder"


def check_owned(folder: Path, marker: str, what: str) -> None:
    """Refuse ``folder`` unless it is absent, empty, or marked as the gate's own."""
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
