"""The pages say what the engine found: every number in a case page's tables is the summary's
record (verify's metrics), the first divergence is marked where verify put it, every failing
tensor gets every plot and passing ones stay a table row."""

from __future__ import annotations

import math

import pytest

from gdncheck.reports.model import build, fmt_num

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


def featured_records(case: dict) -> list[int]:
    """The records a case page plots (docs/report.md), found from the summary alone: the first
    divergence, then the two worst other failing tensors by err / bound, one per tensor name."""
    fd = case["first_divergence"]
    fails = [(i, r) for i, r in enumerate(case["records"]) if r["verdict"] == "fail" and r["metrics"]]
    first = [i for i, r in fails if (r["step"], r["stage"], r["tensor"]) == (fd["step"], fd["stage"], fd["tensor"])]
    seen = {case["records"][i]["tensor"] for i in first}
    extra = []
    for i, r in sorted(fails, key=lambda p: (-p[1]["metrics"]["max_err"] / p[1]["bound"]["elem"], p[1]["step"])):
        if r["tensor"] not in seen and i not in first and len(extra) < 2:
            seen.add(r["tensor"])
            extra.append(i)
    return first + extra


def test_the_first_divergence_and_the_worst_get_every_plot_and_the_rest_stay_their_row(tiled, tiled_report):
    """A page plots a few tensors however many fail: the first divergence (every plot, top-k worst
    elements, every metric) and the two worst others (5 worst elements); every other failing tensor
    is its metrics row, which holds each of its numbers, and passing ones are a row too."""
    sites = tiled_report.parent
    states = 0
    for case, page in case_pages(tiled_report, tiled.doc):
        sections = {s.attrs["id"]: s for s in page.find_all("section", cls="tensor")}
        featured = featured_records(case.raw) if case.status == "fail" else []
        assert sorted(sections) == sorted(f"r{i}" for i in featured)
        assert not featured or list(sections)[0] == f"r{featured[0]}"  # the first divergence first
        for r in case.records:
            row = page.find("tr", id=f"t-{r.anchor}")
            assert row is not None and r.verdict in row.classes()
            if int(r.anchor[1:]) not in featured:
                assert r.anchor not in sections, f"{case.id}: {r.verdict} {r.tensor} call {r.call} has a section"
                continue
            sec = sections.pop(r.anchor)
            assert row.find("a").attrs["href"] == f"#{r.anchor}"  # the row links to its plots
            heat = sec.find("img", cls="heatmap")
            assert (sites / "cases" / heat.attrs["src"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert sec.find("img", cls="cbar") is not None
            assert sec.find("svg", cls="histogram") is not None
            # error over tokens (a state: over calls), unless there is one token (one call) only: no empty plot
            one = r.raw["shape"][1] == 1 if not r.is_state else \
                sum(x.tensor == r.tensor and x.op != "save" for x in case.records) == 1
            assert (sec.find("svg", cls="drift") is None) == one, (case.id, r.tensor, r.call)
            kv = sec.find("div", cls="kv").text
            assert f"err ≤ {fmt_num(r.metrics['max_err'])}" in kv and f"NMSE ≤ {fmt_num(r.metrics['nmse'])}" in kv
            assert f"×{fmt_num(r.elem_ratio)} the bound" in kv
            worst = sec.find("table", cls="worst").find("tbody").find_all("tr")
            assert len(worst) == (10 if r.first else 5)
            assert worst[0].find("td").text == "[" + ", ".join(map(str, r.metrics["max_err_index"])) + "]"
            if r.is_state and not one:
                states += 1
                assert "After which call" in sec.text
        assert not sections, f"sections without a featured record: {list(sections)}"
        assert page.text.count(case.raw["repro"]) == (1 if case.raw.get("repro") else 0)  # once, folded
    assert states >= 1  # a state among the worst: its per-call curve


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
