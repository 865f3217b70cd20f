"""The report stays small and quick however much fails: a port failing every case of the default
suite (norm_weight_plain: w instead of 1 + w, every float tensor of every call wrong) gets a report
of at most 60 kB a failing case (46 cases of the 71-case suite: 2.29 MB, 49.8 kB a case; 1.77 MB, 55 kB
a case, when the default suite had 57 cases, 32 of them failing). A case page plots its first divergence
and a few of its worst tensors (reports/assets.py: 1 + EXTRA), whatever else fails; every other failing
tensor is its row in the metrics tables. So the report grows with the cases and the judged tensors (a row
each), not with plots per failing tensor: before, the same run wrote 16.6 MB (6.5 MB of PNG, 520 kB a
case) in 195 s of CPU; docs/report.md has the numbers. The budget is a case's, so that a suite that
grows does not break it, while a plot per failing tensor (ten times it) always would."""

from __future__ import annotations

import re
from io import BytesIO

import pytest
from PIL import Image

from gdncheck.reports import tensors, write_report
from gdncheck.reports.assets import EXTRA
from gdncheck.reports.model import build

from .conftest import mutant_run

#: bytes of report a failing case may cost, its page, plots and rows in the index
BUDGET_PER_CASE = 60_000


@pytest.fixture(scope="module")
def every_case_failing(tmp_path_factory):
    return mutant_run(tmp_path_factory, "norm_weight_plain", None)


def test_a_port_failing_every_case_gets_a_report_of_at_most_60_kb_a_case(every_case_failing, tmp_path):
    doc = every_case_failing.doc
    judged = [c for c in doc["cases"] if c["kind"] == "forward" and c["records"]]
    assert judged and all(c["status"] == "fail" for c in judged)  # every case that judges a tensor fails
    failing = sum(r["verdict"] == "fail" for c in judged for r in c["records"])
    site = write_report(doc, tmp_path / "site").parent
    files = [p for p in site.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    png = sum(p.stat().st_size for p in files if p.suffix == ".png")
    print(f"\n{len(judged)} failing cases, {failing} failing tensors: {total} bytes ({png} of PNG)")
    assert total < BUDGET_PER_CASE * len(judged), f"{total / len(judged):.0f} bytes a failing case"
    for path in (site / "cases").rglob("*heatmap.png"):
        w, h = Image.open(BytesIO(path.read_bytes())).size
        assert w <= tensors.HEAT_COLS and h <= tensors.HEAT_ROWS  # pooled, never the full tensor
    for case in build(doc).cases:
        page = (site / "cases" / f"{case.page}.html").read_text(encoding="utf-8")
        assert len(page.encode()) < 200_000  # numbers and top-k lists, no full data
        sections = len(re.findall(r'<section class="tensor', page))
        heatmaps = len(re.findall(r'class="plot heatmap"', page))
        assert heatmaps <= 1 + EXTRA, (case.id, heatmaps)  # plots for a few tensors, not for every failing one
        assert sections >= heatmaps
