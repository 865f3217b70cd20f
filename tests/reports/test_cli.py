"""``gdncheck report`` and ``gdncheck verify --report``: what they write, print and refuse."""

from __future__ import annotations

import json

from gdncheck.cli import main
from gdncheck.reports import load_summary
from gdncheck.reports.model import ReportInputError

from .conftest import TILED_CASES, TILED_FAILING, tensor_counts
from .pages import parse


def test_report_writes_the_site_and_the_summaries(tiled, tmp_path, capsys):
    path = tmp_path / "summary.json"
    tiled.summary.write(path)
    md = tmp_path / "step-summary.md"
    md.write_text("earlier step\n")
    assert main(["report", str(path), "-o", str(tmp_path / "site"), "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    failing, total = tensor_counts(TILED_FAILING, "delta_rule")[0], tensor_counts(TILED_CASES, "delta_rule")[1]
    assert out.startswith(f"gdncheck: DOES NOT CONFORM — 2 of 4 cases fail, 0 unusable; {failing} of {total} "
                          "tensors fail")
    assert "FAIL  dk-gt-dv_T63_Hk2_Hv6_dk16_dv8_s0: call 0, stage delta_rule, tensor core" in out
    assert out.rstrip().endswith(f"report: {tmp_path / 'site' / 'index.html'}")
    assert (tmp_path / "site" / "index.html").is_file()
    text = md.read_text()
    assert text.startswith("earlier step\n### gdncheck: does not conform")  # appended, as CI summaries are
    # a second run replaces the earlier report
    (tmp_path / "site" / "stale.txt").write_text("x")
    assert main(["report", str(path), "-o", str(tmp_path / "site"), "--quiet"]) == 0
    assert not (tmp_path / "site" / "stale.txt").exists() and capsys.readouterr().out == ""


def test_report_refuses_bad_input_in_one_line(tmp_path, capsys, tiled):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something-else"}))
    assert main(["report", str(other), "-o", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected a summary of schema 'gdncheck-verify-summary'" in err
    assert not (tmp_path / "site").exists()
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main(["report", str(broken)]) == 2
    assert "expected a JSON verify summary" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "absent.json")]) == 2
    assert "no summary file" in capsys.readouterr().err
    # a folder that holds something else is never replaced
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me")
    good = tmp_path / "s.json"
    tiled.summary.write(good)
    assert main(["report", str(good), "-o", str(mine)]) == 2
    assert "is not an earlier gdncheck report" in capsys.readouterr().err
    assert (mine / "thesis.tex").read_text() == "keep me" and len(list(tmp_path.glob(".mine.*"))) == 0


def test_a_summary_that_breaks_its_schema_is_named(tiled):
    doc = json.loads(json.dumps(tiled.doc))
    doc["cases"][0]["records"][0]["verdict"] = "maybe"
    try:
        load_summary(doc)
    except ReportInputError as exc:
        assert "cases/0/records/0/verdict" in str(exc) and exc.code == "report_input"
    else:
        raise AssertionError("a broken record was accepted")


def test_verify_writes_the_report_too(tiled, tmp_path, capsys):
    code = main(["verify", "--fixtures", str(tiled.fixtures), "--outputs", str(tiled.outputs), "--profile", "bf16",
                 "--case", "decode_T12", "--summary", str(tmp_path / "s.json"), "--report", str(tmp_path / "r")])
    assert code == 1  # the verdict's exit status, unchanged by the report
    out = capsys.readouterr().out
    assert f"report: {tmp_path / 'r' / 'index.html'}" in out
    index = parse(tmp_path / "r" / "index.html")
    assert len(index.find("table", id="grid").find("tbody").find_all("tr")) == 1
    page = parse(next((tmp_path / "r" / "cases").glob("*.html")))
    assert page.find("img", cls="heatmap") is not None
