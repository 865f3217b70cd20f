"""Is an engine installed here, and which versions of its packages: what the matrix's rows say before any
engine runs (nothing of an engine is imported: :func:`importlib.util.find_spec`, package metadata, files)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .schema import Engine


@dataclass
class Probe:
    installed: bool
    missing: list[str]
    versions: dict[str, str | None]

    def hint(self, eng: Engine) -> str | None:
        """``not installed: pip install ...`` for an engine that is not, else None."""
        if self.installed:
            return None
        return f"not installed ({', '.join(self.missing)} missing): {eng.install or 'see docs/engines.md'}"


def module_available(name: str) -> bool:
    """Whether the top-level module ``name`` can be imported here, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def package_version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def probe(eng: Engine) -> Probe:
    """Is ``eng`` installed (every module, program and file of its glue it needs found), and which
    versions of its packages (Python distributions, and npm packages of its glue folder)."""
    missing = [m for m in eng.modules if not module_available(m)]
    missing += [p for p in eng.programs if shutil.which(p) is None]
    folder = eng.glue_folder()
    if folder is not None:
        missing += [os.path.normpath(folder / n) if ".." in n else str(folder / n) for n in (".", *eng.needs)
                    if not (folder / n).exists()]
    versions = {p: package_version(p) for p in eng.packages}
    versions.update({p: npm_version(folder, p) for p in eng.npm_packages} if folder is not None else {})
    return Probe(not missing, missing, versions)


def npm_version(folder: Path, package: str) -> str | None:
    """The version of npm package ``package`` installed in ``folder`` (its package.json), else None."""
    try:
        v = json.loads((folder / "node_modules" / package / "package.json").read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, str) else None

