"""Whether a failing case's golden file is what its recipe builds (issue 26: a tampered suite).

A fixture folder other than the packaged one is trusted as far as its manifest goes: every case file
matches the manifest's sha256. But a manifest whose sha256 was recomputed after the weights changed
passes that check, and a correct port then fails with the blame on itself ("head grouping tiled").
So, for a failing case of a suite gdncheck knows by name (``default``, ``full``, ``serving``), verify
rebuilds the case from its recipe in memory (the golden arithmetic makes it bit-identical on every
CPU, FORMAT.md §10) and compares the bytes: a golden that does not reproduce is said so, on the
case and in the summary, and the likely cause names that instead of a bug class. Bounded: at most
:data:`LIMIT` cases of one run are rebuilt (each takes a fraction of a second).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gdncheck.errors import GDNError
from gdncheck.fixtures.build import build_case
from gdncheck.fixtures.cases import suite
from gdncheck.fixtures.manifest import DEFAULT_DIR, case_file

#: failing cases rebuilt per verify run
LIMIT = 8


class Provenance:
    """Rebuilds failing cases of a named suite and says which goldens do not reproduce."""

    def __init__(self, fixtures_dir: str | Path, manifest: dict):
        self.dir = Path(fixtures_dir)
        self.suite = manifest.get("suite")
        self.checked = 0
        self.changed: list[str] = []
        packaged = self.dir.resolve() == DEFAULT_DIR.resolve()
        self.active = not packaged and self.suite in ("default", "full", "serving")
        self._specs = None

    def check(self, entry: dict) -> str | None:
        """None when the case's golden is what its recipe builds (or it cannot be told); else why not."""
        if not self.active or self.checked >= LIMIT:
            return None
        try:
            if self._specs is None:
                self._specs = {s.case_id(entry["seed"]): s for s in suite(self.suite)}
            spec = self._specs.get(entry["id"])
            if spec is None:  # a seed or a case this version does not build
                return None
            self.checked += 1
            data, _ = build_case(spec, entry["seed"])
            found = hashlib.sha256(case_file(self.dir, entry).read_bytes()).hexdigest()
        except (GDNError, OSError, ValueError):
            return None
        rebuilt = hashlib.sha256(data).hexdigest()
        if rebuilt == found:
            return None
        self.changed.append(entry["id"])
        return (f"the golden file does not reproduce from its recipe (suite {self.suite!r} rebuilds sha256 "
                f"{rebuilt[:16]}, the file holds {found[:16]}): the fixtures were changed after they were built, "
                f"so this verdict is against changed goldens, not the reference's (gdncheck fixtures check "
                f"{self.dir})")

    def note(self) -> str | None:
        if not self.changed:
            return None
        return (f"{len(self.changed)} failing case(s) whose goldens do not reproduce from their recipes (the "
                f"fixtures in {self.dir} were changed): {', '.join(self.changed)}")
