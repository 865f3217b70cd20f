"""Every string that comes from a port's files is shown as text: in element content, in
attributes, in file names, in the Markdown and the text summaries."""

from __future__ import annotations

import copy
import json
import re
import shlex

import pytest

from gdncheck.reports import markdown_summary, text_summary, write_report
from gdncheck.reports.site import TEMPLATES

from .pages import parse

XSS = {
    "id": "<script>alert('id')</script>\"'&",
    "tag": "\"><script>alert('tag')</script>",
    "tensor": "<script>alert(1)</script>",
    "stage": "<marquee onmouseover=alert(2)>",
    "impl": "<img src=x onerror=alert('impl')>",
    "device": "\"><svg onload=alert(3)>",
    "message": "</div><script>alert('msg')</script>",
    # a repro line as gdncheck writes one (checked_repro keeps it), its quoted words markup
    "repro": shlex.join(["gdncheck", "verify", "--outputs",
                         "<img src=x onerror=alert(9)> | `x` *y* [z](javascript:alert(4))", "--profile", "f32",
                         "--case", "c"]),
    "env": "v\"'<>",
    "note": "<script>alert('note')</script>",
    "err": "<iframe src=javascript:alert(5)>",
}


#: what the report's inline SVG plots are made of (reports/plots.py)
SVG_TAGS = {"svg", "path", "text", "g", "circle", "rect"}


@pytest.fixture(scope="module")
def hostile(tiled):
    """The tiled run's summary with a port's strings replaced by markup."""
    doc = copy.deepcopy(tiled.doc)
    doc["implementation"].update(name=XSS["impl"], device=XSS["device"], command=XSS["repro"])
    doc["environment"]["<script>k</script>"] = XSS["env"]
    doc["notes"].append(XSS["note"])
    case = next(c for c in doc["cases"] if c["status"] == "fail")
    case.update(id=XSS["id"], message=XSS["message"], repro=XSS["repro"])
    case["tags"].append(XSS["tag"])
    fails = [r for r in case["records"] if r["verdict"] == "fail"]
    if case["first_divergence"]["tensor"] == fails[0]["tensor"]:  # still the first divergence: plotted
        case["first_divergence"]["tensor"] = XSS["tensor"]
    fails[0]["tensor"] = XSS["tensor"]
    fails[-1]["stage"] = XSS["stage"]
    fails[1]["message"] = XSS["message"]
    err_case = next(c for c in doc["cases"] if c["kind"] == "error")
    err_case["error_check"]["actual_message"] = XSS["err"]
    return doc


@pytest.fixture(scope="module")
def site(hostile, tmp_path_factory):
    return write_report(hostile, tmp_path_factory.mktemp("xss") / "site").parent


def test_no_markup_from_the_summary_survives(site):
    filters = (TEMPLATES / "filters.js").read_text()
    pages = [site / "index.html", *sorted((site / "cases").glob("*.html"))]
    assert len(pages) == 5
    for path in pages:
        root = parse(path)
        scripts = root.find_all("script")
        assert [s.text for s in scripts] == ([" ".join(filters.split())] if path.name == "index.html" else [])
        for el in root.iter():
            assert el.tag not in ("iframe", "marquee"), f"{path.name}: a <{el.tag}> element from the summary"
            if el.tag == "svg":  # the report's own inline plots, drawn from numbers: nothing else in them
                assert "plot" in el.classes(), f"{path.name}: an <svg> element from the summary"
                assert {e.tag for e in el.iter()} <= SVG_TAGS, f"{path.name}: {[e.tag for e in el.iter()]}"
            assert not any(a.lower().startswith("on") for a in el.attrs), f"{path.name}: {el.tag} {el.attrs}"
            assert el.attrs.get("src") != "x"
            assert not str(el.attrs.get("href", "")).startswith("javascript")


def test_the_strings_show_as_text(site, hostile):
    index = parse(site / "index.html")
    text = index.text
    for key in ("impl", "device", "note"):
        assert XSS[key] in text, key
    assert f"<script>k</script> {XSS['env']}" in text
    row = next(tr for tr in index.find("table", id="grid").find_all("tr") if tr.attrs.get("data-status") == "fail")
    link = row.find("a")
    assert link.text == XSS["id"] and link.attrs["title"] == XSS["id"]  # in an attribute, decoded back exactly
    assert json.loads(row.attrs["data-tags"])[-1] == XSS["tag"]
    stage_cols = [th.text for th in index.find("thead").find_all("th", cls="stage")]
    assert stage_cols[-1] == XSS["stage"]
    assert any(XSS["stage"] in (td.attrs.get("title") or "") for td in row.find_all("td", cls="c"))
    page = parse(site / "cases" / link.attrs["href"].split("/")[-1])
    ptext = page.text
    assert XSS["id"] in page.find("h1").text
    assert XSS["message"] in ptext and XSS["repro"] in page.find("pre").text
    heads = [h.text for h in page.find_all("h3")]
    assert any(XSS["tensor"] in h for h in heads)
    sec = next(s for s in page.find_all("section", cls="tensor") if XSS["tensor"] in s.find("h3").text)
    assert sec.find("img", cls="heatmap").attrs["alt"].startswith(f"error heatmap of {XSS['tensor']}")
    err_row = next(tr for tr in index.find("table", id="grid").find_all("tr") if "error-" in tr.text)
    err_page = parse(site / "cases" / err_row.find("a").attrs["href"].split("/")[-1])
    assert XSS["err"] in err_page.find("dl", cls="facts").text


def test_file_names_are_safe(site):
    for path in site.rglob("*"):
        assert re.fullmatch(r"[A-Za-z0-9._-]+", path.name), path


def test_markdown_is_inert(hostile):
    md = markdown_summary(hostile, report="out/<b>index</b>.html")
    for raw in ("<script", "<img", "<svg", "<iframe", "<marquee", "<b>"):
        assert raw not in md, raw
    assert "&lt;script&gt;" in md and "&lt;img src=x onerror=alert(&#x27;impl&#x27;)&gt;" in md
    assert md.startswith("### gdncheck: does not conform") and "\n\n| | |\n" in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and "fail" in line]
    assert rows, md
    for line in md.splitlines():
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line)
            assert len(cells) in (4, 7), line  # 2 or 5 columns: no value opened a cell
    assert "[z](javascript" not in md.split("<details>")[0]  # no live link outside the <pre> blocks
    pre = md.split("<details>")[1]
    assert "&lt;img src=x onerror=alert(9)&gt;" in pre


def test_text_summary_is_one_line_per_item(hostile):
    doc = copy.deepcopy(hostile)
    doc["implementation"]["name"] = "evil\x1b[2J\nFAKE  all cases pass"
    text = text_summary(doc, report="site/index.html")
    assert "\x1b" not in text
    lines = text.splitlines()
    assert lines[0].startswith("gdncheck: DOES NOT CONFORM") and "FAKE  all cases pass" in lines[0]
    assert sum(line.startswith("FAIL ") for line in lines) == 2 and lines[-1] == "report: site/index.html"
