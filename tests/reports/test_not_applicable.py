"""The report shows not-applicable cases (issue 11, item 9): a filter for them, their row in the grid
with the reason, a case page that says from which step, why, and which optional feature; the text
summary lists them as n/a, never as failures; the banner shows the coverage."""

from __future__ import annotations

import pytest

from gdncheck.conformance.judge.verify import verify
from gdncheck.reports import text_summary, write_report
from tests.fixtures.outputs import perfect_outputs
from tests.helpers import default_case_id

from .pages import parse

CASES = ["per-head-norm_T", "snapshot-replay", "prefill_T1_"]


@pytest.fixture(scope="module")
def na_report(tmp_path_factory):
    from gdncheck.fixtures.manifest import DEFAULT_DIR

    out = tmp_path_factory.mktemp("na")
    perfect_outputs(DEFAULT_DIR, "per-head-norm_T", out,
                    alter=lambda t: [t.pop(k) for k in [k for k in t if not k.startswith("calls.0.")]],
                    meta={"not_applicable": "no per-head norm here", "not_applicable_step": "2"})
    perfect_outputs(DEFAULT_DIR, "snapshot-replay", out, alter=lambda t: t.clear(),
                    meta={"not_applicable": "no snapshot files here", "not_applicable_step": "0"})
    perfect_outputs(DEFAULT_DIR, "prefill_T1_", out)
    doc = verify(DEFAULT_DIR, out, "bf16", cases=CASES).to_json()
    assert doc["exit_code"] == 0 and doc["totals"]["not_applicable"] == 2
    return doc, write_report(doc, tmp_path_factory.mktemp("site") / "site")


def test_the_index_filters_and_shows_not_applicable_cases(na_report):
    doc, index = na_report
    page = parse(index)
    boxes = [i.attrs["value"] for i in page.find("form", id="filters").find_all("input", name="status")]
    assert "not_applicable" in boxes and len(boxes) == 4
    rows = {tr.find("td", cls="id").find("a").text: tr for tr in page.find("table", id="grid").find_all("tr")
            if tr.attrs.get("data-status")}
    snap = rows[default_case_id("snapshot-replay")]
    assert snap.attrs["data-status"] == "not_applicable"
    assert "not applicable from step 0 (construct): no snapshot files here" in snap.text
    head = rows[default_case_id("per-head-norm")]
    assert "not applicable from step 2 (forward): no per-head norm here" in head.text
    assert head.find("td", cls="pass") is not None  # the call before it, judged
    assert "coverage: 3 of 3" not in page.text and "coverage: 1 of 3 cases judged" in page.text


def test_a_case_page_says_why(na_report):
    _doc, index = na_report
    page = parse(index.parent / "cases" / f"{default_case_id('per-head-norm')}.html")
    na = page.find("div", id="not-applicable")
    assert na is not None and "from step 2 (forward): no per-head norm here" in na.text
    assert "per_head_norm" in na.text and "judged below" in na.text


def test_the_text_summary_lists_them_as_not_applicable(na_report):
    doc, _ = na_report
    text = text_summary(doc)
    assert "n/a   per-head-norm" in text and "n/a   snapshot-replay" in text and "FAIL" not in text
