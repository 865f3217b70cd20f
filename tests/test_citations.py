"""Every citation of a contract document resolves to a section that exists in the repository.

Code, docs, tests and templates cite ``docs/spec.md §N`` (older lines: ``SPEC §N``, the same
sections), ``docs/math.md §N``, other ``docs/*.md §N`` and ``fixtures/FORMAT.md §N``. A citation of a
document outside the repository (the research notes it was first written from) is a dead end for
a reader, and fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".j2", ".toml", ".txt", ".sh", ".yml", ".yaml", ".cfg"}
SKIP_DIRS = {".git", ".venv", "build", "dist", "artifacts", "node_modules", "__pycache__", "default",
             ".pytest_cache", ".ruff_cache", ".hypothesis"}

#: ``DOC §N`` with any ``, §M`` / ``-M`` that follows (``SPEC §2, §4``; ``FORMAT.md §4-5``).
CITATION = re.compile(r"(?P<doc>docs/[\w-]+\.md|(?:fixtures/)?FORMAT\.md|SPEC)\s?"
                      r"(?P<secs>§[\d.]+(?:(?:,\s?|-)§?[\d.]+)*)")
SECTION = re.compile(r"\d+(?:\.\d+)*")
#: Names of the research notes outside the repository.
OUTSIDE = re.compile(r"research/[\w-]+\.md|\b(?:gdn-spec|seed-ports|perf-anchors|conformance-anchors|"
                     r"aesthetics-anchors)\b")
#: Files allowed to cite notes outside the repository (none).
PENDING: set[str] = set()


def _files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if path.is_file() and path.suffix in TEXT_SUFFIXES and not SKIP_DIRS & set(rel.parts[:-1]) \
                and not any(p.endswith(".egg-info") for p in rel.parts):
            out.append(path)
    return sorted(out)


def _document(doc: str) -> Path:
    if doc == "SPEC":
        return ROOT / "docs" / "spec.md"
    if doc.endswith("FORMAT.md"):
        return ROOT / "fixtures" / "FORMAT.md"
    return ROOT / doc


def sections(path: Path) -> set[str]:
    """The section numbers of a document's headings: ``## §2 ...``, ``## 2. ...``, ``### 2.1 ...``."""
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#{2,}\s+§?(\d+(?:\.\d+)*)\.?\s", line)
        if m:
            found.add(m.group(1))
    return found


def citations(text: str) -> list[tuple[str, str]]:
    """(document, section) of every citation in ``text``."""
    out = []
    for m in CITATION.finditer(text):
        for sec in SECTION.findall(m.group("secs")):
            out.append((m.group("doc"), sec.rstrip(".")))
    return out


def test_the_patterns_read_citations_as_written():
    text = "see SPEC §2, §4 and docs/math.md §6; fixtures/FORMAT.md §7. or docs/tolerances.md §2.1 (FORMAT.md §4-5)"
    assert citations(text) == [("SPEC", "2"), ("SPEC", "4"), ("docs/math.md", "6"), ("fixtures/FORMAT.md", "7"),
                               ("docs/tolerances.md", "2.1"), ("FORMAT.md", "4"), ("FORMAT.md", "5")]
    assert OUTSIDE.search("(research/gdn-spec.md §4)") and OUTSIDE.search("perf-anchors §3.2")
    assert not OUTSIDE.search("docs/math.md §2")


def test_every_cited_document_has_its_sections():
    assert sections(ROOT / "docs" / "spec.md") == {"1", "2", "3", "4", "5", "6"}
    assert {"2", "2.1"} <= sections(ROOT / "docs" / "tolerances.md")


def problems(text: str, *, outside_allowed: bool = False) -> list[str]:
    """What is wrong with the citations in ``text``: missing documents or sections, outside documents."""
    bad = []
    for doc, sec in citations(text):
        target = _document(doc)
        if not target.is_file():
            bad.append(f"{doc} §{sec}: no file {target.relative_to(ROOT)}")
        elif sec not in sections(target):
            bad.append(f"{doc} §{sec}: {target.relative_to(ROOT)} has no section {sec}")
    if not outside_allowed:
        bad += [f"{m.group(0)}: a document outside the repository (cite docs/spec.md or docs/math.md)"
                for m in OUTSIDE.finditer(text)]
    return bad


def test_a_dead_citation_is_found():
    assert problems("docs/spec.md §4 and SPEC §6") == []
    assert problems("docs/spec.md §9") == ["docs/spec.md §9: docs/spec.md has no section 9"]
    assert problems("docs/nothing.md §1") == ["docs/nothing.md §1: no file docs/nothing.md"]
    assert len(problems("as in research/gdn-spec.md §4")) == 1


def test_every_citation_in_the_repository_resolves():
    here = Path(__file__).resolve()
    bad = {}
    for path in _files():
        if path == here:  # its examples are dead on purpose
            continue
        rel = str(path.relative_to(ROOT))
        found = problems(path.read_text(encoding="utf-8", errors="replace"), outside_allowed=rel in PENDING)
        if found:
            bad[rel] = found
    assert not bad, "\n".join(f"{f}: {'; '.join(p)}" for f, p in bad.items())
