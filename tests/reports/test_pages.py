"""The pages say what the engine found: every number in a case page's tables is the summary's
record (verify's metrics), the first divergence is marked where verify put it, every failing
tensor gets every plot and passing ones stay a table row."""

from __future__ import annotations

import math

import pytest

from gdncheck.reports.model import build, fmt_num

from .conftest import TILED_FAILING, calls_expecting
from .pages import parse

#: metrics table columns (after stage, tensor, verdict) and where each comes from in a record
COLUMNS = [("NMSE", lambda r: r["metrics"]["nmse"]), ("SQNR dB", lambda r: r["metrics"]["sqnr_db"]),
           ("max abs", lambda r: r["metrics"]["max_abs"]), ("max rel", lambda r: r["metrics"]["max_rel"]),
           ("max ULP", lambda r: r["metrics"]["max_ulp"]), ("cosine", lambda r: r["metrics"]["cosine"]),
           ("max err", lambda r: r["metrics"]["max_err"]), ("bound", lambda r: r["bound"]["elem"]),
           ("err/bound", lambda r: r["metrics"]["max_err"] / r["bound"]["elem"]),
           ("NMSE bound", lambda r: r["bound"]["nmse"]),
           ("NMSE/bound", lambda r: r["metrics"]["nmse"] / r["bound"]["nmse"]),
           ("over", lambda r: r["over_bound"])]


def shown(text: str) -> float:
    return float(text.lstrip("×"))


def case_pages(report, doc):
    view = build(doc)
    return [(c, parse(report.parent / "cases" / f"{c.page}.html")) for c in view.cases]


def test_metrics_tables_show_the_records_numbers(tiled, tiled_report):
    checked = 0
    for case, page in case_pages(tiled_report, tiled.doc):
        for i, rec in enumerate(case.raw["records"]):
            row = page.find("tr", id=f"t-r{i}")
            assert row is not None, f"{case.id}: no table row for record {i} ({rec['tensor']}, call {rec['call']})"
            cells = [td.text for td in row.find_all("td")]
            assert cells[:2] == [rec["stage"], rec["tensor"]]
            assert cells[2].startswith(rec["verdict"])
            if rec["metrics"] is None:
                continue
            head = [th.text for th in row.parent.parent.find("thead").find_all("th")]
            for name, value in COLUMNS:
                text = cells[head.index(name)]
                want = value(rec)
                assert math.isclose(shown(text), want, rel_tol=5e-3 if name != "cosine" else 5e-6), \
                    f"{case.id} record {i} {rec['tensor']}: {name} shows {text}, the record holds {want}"
                checked += 1
            if rec["first_bad_token"] is not None:
                assert cells[-1].startswith(f"{rec['first_bad_token']} (pos {rec['first_bad_position']}")
    assert checked > 12 * 40  # every column of every judged tensor of the three forward cases


def test_first_divergence_is_marked_where_verify_found_it(tiled, tiled_report):
    index = parse(tiled_report)
    grid = index.find("table", id="grid")
    columns = [th.text for th in grid.find("thead").find_all("th", cls="stage")]
    rows = grid.find("tbody").find_all("tr")
    assert len(rows) == len(tiled.doc["cases"])
    failing = [c for c in tiled.doc["cases"] if c["status"] == "fail"]
    assert len(failing) == 2
    for case, row in zip(tiled.doc["cases"], rows):
        firsts = [i for i, td in enumerate(row.find_all("td", cls="c")) if "first" in td.classes()]
        if case["status"] == "fail":
            assert firsts == [columns.index(case["first_divergence"]["stage"])], case["id"]
            assert case["first_divergence"]["stage"] == "delta_rule"
        else:
            assert firsts == []
    for case, page in case_pages(tiled_report, tiled.doc):
        if case.status != "fail":
            assert page.find("section", cls="tensor") is None
            continue
        fd = case.first
        box = page.find("div", id="first").text
        assert f"call {fd.call}" in box and f"stage {fd.stage}" in box and f"token {fd.token}" in box
        sections = page.find_all("section", cls="tensor")
        assert "first" in sections[0].classes()
        first = case.records[int(sections[0].attrs["id"][1:])]
        assert (first.step, first.stage, first.tensor) == (fd.step, fd.stage, fd.tensor)
        assert "first" in page.find("tr", id=f"t-{first.anchor}").classes()


def test_every_failing_tensor_gets_every_plot_and_passing_ones_stay_compact(tiled, tiled_report):
    sites = tiled_report.parent
    states = 0
    for case, page in case_pages(tiled_report, tiled.doc):
        sections = {s.attrs["id"]: s for s in page.find_all("section", cls="tensor")}
        for r in case.records:
            if r.verdict != "fail":
                assert r.anchor not in sections, f"{case.id}: passing {r.tensor} has a section"
                continue
            sec = sections.pop(r.anchor)
            imgs = {k: sec.find("img", cls=k) for k in ("heatmap", "histogram", "drift")}
            assert all(imgs.values()), f"{case.id} {r.tensor} call {r.call}: plots {imgs}"
            for img in imgs.values():
                data = (sites / "cases" / img.attrs["src"]).read_bytes()
                assert data[:8] == b"\x89PNG\r\n\x1a\n"
            assert sec.find("img", cls="cbar") is not None
            kv = sec.find("div", cls="kv").text
            assert f"err ≤ {fmt_num(r.metrics['max_err'])}" in kv and f"NMSE ≤ {fmt_num(r.metrics['nmse'])}" in kv
            assert f"×{fmt_num(r.elem_ratio)} the bound" in kv
            worst = sec.find("table", cls="worst").find("tbody").find_all("tr")
            assert len(worst) == 10
            assert worst[0].find("td").text == "[" + ", ".join(map(str, r.metrics["max_err_index"])) + "]"
            assert case.raw["repro"] in sec.text
            if r.is_state:
                states += 1
                assert "After which call" in sec.text
        assert not sections, f"sections without a failing record: {list(sections)}"
    assert states == calls_expecting(TILED_FAILING, "recurrent_state")  # every call of both failing cases


@pytest.mark.parametrize("field", ["implementation", "profile", "tolerances", "fixtures", "environment"])
def test_index_states_what_was_verified(tiled, tiled_report, field):
    text = parse(tiled_report).text
    doc = tiled.doc
    expected = {
        "implementation": [doc["implementation"]["name"]],
        "profile": [f"{doc['profile']} · end to end"],
        "tolerances": [f"v{doc['tolerances']['version']}", doc["tolerances"]["sha256"][:16]],
        "fixtures": [f"format v{doc['fixtures']['format_version']}", doc["fixtures"]["manifest_sha256"][:16]],
        "environment": [f"python {doc['environment']['python']}", f"numpy {doc['environment']['numpy']}"],
    }[field]
    for piece in expected:
        assert piece in text
    t = doc["totals"]
    assert f"{t['failed']} of {t['cases']} cases fail" in text
    assert f"{t['records_failed']} of {t['records']} tensors fail" in text


def test_pages_read_without_javascript(tiled_report):
    index = parse(tiled_report)
    assert "hidden" in index.find("form", id="filters").attrs  # the script shows the filters
    assert all("hidden" not in tr.attrs for tr in index.find("table", id="grid").find_all("tr"))
    assert len(index.find_all("script")) == 1
    for page in (tiled_report.parent / "cases").glob("*.html"):
        assert not parse(page).find_all("script")
