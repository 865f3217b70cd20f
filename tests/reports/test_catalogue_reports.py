"""A report for every real failing port the catalogue gives (issue 25): each mutant of the kill
matrix (conformance/meta: the dense layer's, the sparse block's, the serving patterns') run as a port
in every profile, on a few light cases where its bug shows, verified, then reported. Every kind of
failure a port produces (a NaN, a shape, a missing tensor, a packed call, a routing) goes through the
templates: the report renders, its banner says what the summary's exit code says, every failing case
has a page that names its first divergence, and the folder stays small."""

from __future__ import annotations

from pathlib import Path

import pytest

from gdncheck.conformance.meta.kill_matrix import CATALOGUE, cases_of, documented_block, kill
from gdncheck.fixtures.cases import EDGES, FORWARD_CASES
from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.reports import write_report

#: light dense cases between them showing every dense bug class (a snapshot, a seq-len reset, a
#: per-head norm, dk != dv, a state that must keep small values: f16-state); a mutant's own edge and
#: call recipe are added
LIGHT = ["decode_T12", "prefill-decode", "snapshot-replay", "mismatch-midstream", "per-head-norm", "dk-gt-dv",
         "f16-state"]
#: bug classes that show in bf16 only over a long memory (docs/meta.md: caught by the long decode alone)
LONG_ONLY = ("state_bf16_write_back",)
#: bug classes a shape shows and LIGHT lacks (docs/meta.md, "shapes that hide a wrong read"): the case that has it
SHAPE_ONLY = {"gates_head_major_when_mha": "mha-batch"}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "meta.md"
BANNER = {0: 'class="banner pass"', 1: 'class="banner fail"', 2: 'class="banner error"'}


def documented_cell(mutant: str, profile: str) -> str:
    """The kill matrix's cell for ``mutant`` in ``profile`` (docs/meta.md's generated block)."""
    for line in documented_block(DOCS).splitlines():
        if line.startswith(f"| `{mutant}` ("):
            return line.rstrip(" |").split(" | ")[3 + VERIFY_PROFILES.index(profile)]
    raise AssertionError(f"docs/meta.md's kill matrix has no row for {mutant}")


def _cases(mutant) -> list[str]:
    tagged = cases_of(mutant, DEFAULT_DIR)
    if tagged is not None:  # the sparse block's and the serving patterns' mutants: their tagged cases
        return tagged
    extra = [mutant.call[0]] if mutant.call else []
    if mutant.name in LONG_ONLY:
        extra.append("long-decode")
    if mutant.name in SHAPE_ONLY:
        extra.append(SHAPE_ONLY[mutant.name])
    if mutant.edge:
        extra.append(next(s.name for s in FORWARD_CASES if s.regime == EDGES[mutant.edge]))
    return list(dict.fromkeys(LIGHT + extra))


@pytest.mark.parametrize("profile", VERIFY_PROFILES)
@pytest.mark.parametrize("mutant", CATALOGUE, ids=[m.name for m in CATALOGUE])
def test_every_mutant_as_a_port_gets_a_report(mutant, profile, tmp_path):
    r = kill(mutant, profile, DEFAULT_DIR, out_dir=tmp_path / "out", cases=_cases(mutant))
    doc = r.summary.to_json()
    if documented_cell(mutant.name, profile).startswith("below rounding"):  # docs/meta.md: caught nowhere
        assert not r.killed and doc["exit_code"] == 0, r.message
    else:
        assert r.killed, f"{mutant.name} passes its light cases in {profile}: pick cases where it shows"
        assert doc["exit_code"] == 1, doc["exit_code"]
    index = write_report(doc, tmp_path / "site")
    site = index.parent
    html = index.read_text(encoding="utf-8")
    assert BANNER[doc["exit_code"]] in html
    failing = [c for c in doc["cases"] if c["status"] == "fail"]
    pages = {p.name: p.read_text(encoding="utf-8") for p in (site / "cases").glob("*.html")}
    for c in failing:
        page = next((text for name, text in pages.items() if name.startswith(c["id"])), None)
        assert page is not None, f"no page for failing case {c['id']}: {sorted(pages)}"
        fd = c.get("first_divergence") or {}
        if fd.get("stage"):
            assert fd["stage"] in page, (c["id"], fd)
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    assert size < 150_000 * len(doc["cases"]) + 200_000, f"{size} bytes for {len(doc['cases'])} cases"
