"""Where gdncheck runs from: a source checkout or an installed package, and the one rule that follows.

An installed gdncheck (a wheel, ``pip install "gdncheck @ git+..."``) lives in site-packages, which
belongs to pip: gdncheck reads its packaged data there (the committed fixture suite, the tolerance
table) and never writes into it. A source checkout (an editable install, or running from the
repository) is where those files are rebuilt and committed, so writing them there is the point.
"""

from __future__ import annotations

from pathlib import Path

from .errors import GDNError

#: The installed ``gdncheck`` package folder; in a wheel every sub-package (``gdncheck.fixtures``,
#: ``gdncheck.conformance``, ...) lies below it.
PACKAGE_DIR = Path(__file__).resolve().parent


class InstalledPackageError(GDNError):
    """A write aimed into the installed package (site-packages)."""

    code = "installed_package"


def source_checkout() -> Path | None:
    """The repository root when gdncheck runs from a source checkout (its pyproject.toml and the
    fixtures package beside the core), else None (an installed package)."""
    root = PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "fixtures" / "__init__.py").is_file():
        return root
    return None


def refuse_write_into_package(path: str | Path, flag: str) -> None:
    """Raise :class:`InstalledPackageError` when ``path`` lies inside an installed (not source)
    gdncheck package: site-packages is pip's, and a file written there would outlive an upgrade,
    or be lost by one, and change what every user of that environment is judged against."""
    if source_checkout() is not None:
        return
    target = Path(path).resolve()
    if target == PACKAGE_DIR or PACKAGE_DIR in target.parents:
        raise InstalledPackageError(
            f"{flag} {path} lies inside the installed gdncheck package ({PACKAGE_DIR}); gdncheck never writes "
            f"into site-packages: choose a folder of your own (e.g. --out ./my-fixtures)")
