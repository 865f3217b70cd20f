"""What a page does when it cannot show everything: files that moved or are gone, tensors that
have no values to plot (missing, wrong shape), NaN."""

from __future__ import annotations

import copy

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.conformance.judge.verify import verify
from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.reports import write_report
from gdncheck.reports.assets import EXTRA
from gdncheck.reports.model import build
from tests.fixtures.outputs import case_entry, perfect_outputs

from .conftest import TILED_FAILING
from .pages import parse


def _moved(doc: dict, side: str) -> dict:
    doc = copy.deepcopy(doc)
    for case in doc["cases"]:
        for r in case["records"]:
            if r[side] and r[side]["file"]:
                r[side]["file"] = "/nonexistent/moved/" + r[side]["file"].rsplit("/", 1)[-1]
    return doc


def drawable(case: dict, sec) -> bool:
    """Whether a section's record has an error-over-tokens curve to draw: two tokens, or two calls."""
    rec = case["records"][int(sec.attrs["id"][1:])]
    if rec["tensor"] in ("recurrent_state", "conv_state"):
        return sum(r["tensor"] == rec["tensor"] and r["op"] != "save" for r in case["records"]) > 1
    return rec["shape"][1] > 1


def case_sections(index, doc):
    """(case, section) for every tensor section of every case page."""
    for case in build(doc).cases:
        page = parse(index.parent / "cases" / f"{case.page}.html")
        yield from ((case.raw, sec) for sec in page.find_all("section", cls="tensor"))


def failing_sections(index, doc):
    pages = []
    for case in build(doc).cases:
        page = parse(index.parent / "cases" / f"{case.page}.html")
        pages.extend(page.find_all("section", cls="tensor"))
    return pages


def test_outputs_gone_gives_a_note_and_the_summarys_drift(tiled, tmp_path):
    doc = _moved(tiled.doc, "actual_ref")
    index = write_report(doc, tmp_path / "site")
    sections = list(case_sections(index, doc))
    assert len(sections) == len(TILED_FAILING) * (1 + EXTRA)  # the plotted ones: a first divergence, two worst
    for case, sec in sections:
        text = sec.text
        assert "outputs file not found" in text and "pass --outputs DIR" in text
        assert sec.find("img", cls="heatmap") is None and sec.find(cls="histogram") is None
        assert sec.find("table", cls="worst") is None
        assert "max err" in sec.find("div", cls="kv").text  # the summary's numbers are still there
        drift = sec.find("svg", cls="drift")
        # tokens: the summary's per-token profile; states: the summary's per-call errors; a one-token call none
        assert (drift is not None) == drawable(case, sec), sec.find("h3").text
        if drift is not None and "After which call" not in text:
            assert "per-token profile" in text
    # the same names in another folder: everything is back
    index = write_report(doc, tmp_path / "site", outputs_dir=tiled.outputs)
    for sec in failing_sections(index, doc):
        assert sec.find("img", cls="heatmap") is not None and "not found" not in sec.text


def test_fixtures_gone_gives_a_note(tiled, tmp_path):
    doc = _moved(tiled.doc, "expected_ref")
    index = write_report(doc, tmp_path / "site")
    sections = failing_sections(index, doc)
    assert sections and all("fixture file not found" in s.text and "--fixtures DIR" in s.text for s in sections)
    index = write_report(doc, tmp_path / "site2", fixtures_dir=DEFAULT_DIR)
    assert all(s.find("img", cls="heatmap") is not None for s in failing_sections(index, doc))


def test_tensors_without_values_or_with_nan(tmp_path):
    def alter(t):
        t["calls.0.z"] = t["calls.0.z"][:, :, :, :-1]  # wrong shape
        t["calls.0.core"][0, 3, 1, 2] = np.nan
        del t["calls.0.q"]  # optional: "missing"
        del t["calls.0.out"]  # required: fails

    perfect_outputs(DEFAULT_DIR, "decode_T12", tmp_path / "out", alter=alter)
    doc = verify(DEFAULT_DIR, tmp_path / "out", "f32", cases=["decode_T12"]).to_json()
    reasons = {r["tensor"]: (r["verdict"], r["reason"]) for r in doc["cases"][0]["records"]}
    assert reasons["z"] == ("fail", "shape") and reasons["core"] == ("fail", "nan")
    assert reasons["q"] == ("missing", None) and reasons["out"] == ("fail", "missing_required")
    index = write_report(doc, tmp_path / "site")
    page = parse(next((index.parent / "cases").glob("*.html")))
    by_tensor = {s.find("h3").text.split(" · ")[-1].split(" — ")[0]: s for s in page.find_all("section", cls="tensor")}
    assert set(by_tensor) == {"z", "core", "out"}
    first = page.find("div", cls="msg")  # the first divergence's message: in the box above its section
    for name in ("z", "out"):
        rec = next(r for r in doc["cases"][0]["records"] if r["tensor"] == name)
        assert by_tensor[name].find("img") is None and by_tensor[name].find("svg") is None
        assert rec["message"] in (by_tensor[name].find("div", cls="msg") or first).text
    dv = GDNConfig.from_hf(dict(case_entry(DEFAULT_DIR, "decode_T12")["config"])).head_v_dim
    assert f"shape [1, 12, 4, {dv - 1}], but should be [1, 12, 4, {dv}]" in first.text  # z: the first divergence
    assert "first" in by_tensor["z"].classes()
    core = by_tensor["core"]
    assert core.find("img", cls="heatmap") is not None and "NaN 1, first at [0, 3, 1, 2]" in core.text
    worst = core.find("table", cls="worst").find("tbody").find_all("tr")[0]
    assert worst.find("td").text == "[0, 3, 1, 2]" and "nan" in worst.text
    row_q = next(tr for tr in page.find_all("tr") if tr.find("td") and tr.find_all("td")[1:2]
                 and tr.find_all("td")[1].text == "q")
    assert "missing" in row_q.classes()


def test_raising_and_unusable_cases(tmp_path):
    """A forward case whose implementation raised, and one without an outputs file (unusable)."""
    perfect_outputs(DEFAULT_DIR, "decode_T12", tmp_path / "out",
                    meta={"error_code": "boom", "error_message": "<b>kernel</b> failed", "error_step": "1"})
    doc = verify(DEFAULT_DIR, tmp_path / "out", "f32", cases=["decode_T12", "prefill_T1_"]).to_json()
    assert [c["status"] for c in doc["cases"]] == ["fail", "error"]
    index = write_report(doc, tmp_path / "site")
    rows = parse(index).find("table", id="grid").find("tbody").find_all("tr")
    assert "raised" in rows[0].find("td", cls="span").text
    assert "unusable: no outputs file prefill_T1_Hk1_Hv1_dk16_dv16_s0.safetensors" in rows[1].text
    pages = {c.id: parse(index.parent / "cases" / f"{c.page}.html") for c in build(doc).cases}
    raised = pages["decode_T12_Hk2_Hv4_dk16_dv16_s0"]
    msg = raised.find("div", cls="msg").text
    assert msg.startswith("the implementation raised boom at step 1 (decode): <b>kernel</b> failed")
    assert raised.find("section", cls="tensor") is None
    assert "Unusable inputs: no outputs file" in pages["prefill_T1_Hk1_Hv1_dk16_dv16_s0"].text
