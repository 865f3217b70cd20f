"""A sharded case's report (docs/report.md, "A sharded case"; docs/sharding.md): its records are judged rank by
rank and carry no tensor metrics, only each rank's figures (the summary's ``shard``). The page shows them in
its metrics tables (rank, the rank's tensor and share, error, bound, ratio, NMSE, bound, ratio), in the
first divergence and in each failing rank's section, and the text and Markdown summaries give the ratios:
the numbers the summary holds, checked here against an error recomputed from the rank's own file."""

from __future__ import annotations

import numpy as np
import pytest

from gdncheck.reports.model import fmt_num
from gdncheck.reports.summaries import markdown_summary, text_summary
from gdncheck.safetensors_io import SafetensorsFile

from .conftest import SHARDED_CASES
from .pages import parse

UNEVEN, EVEN = SHARDED_CASES


def _case(run, cid):
    return next(c for c in run.doc["cases"] if c["id"] == cid)


def _page(report, cid):
    return parse(report.parent / "cases" / f"{cid}.html")


def _cells(row) -> list[str]:
    return [td.text for td in row.find_all("td")]


def _partial_error(run) -> tuple[float, float]:
    """Rank 0's out_proj partial on tp3-uneven, call 0 (value heads 0-1), recomputed from its rank file and the
    goldens: (max |got - want| over max |attn_out|, the share's mean square error over attn_out's)."""
    gold = SafetensorsFile(run.fixtures / f"{UNEVEN}.safetensors")
    got = np.asarray(SafetensorsFile(run.outputs / f"{UNEVEN}.rank0.safetensors").read("calls.0.attn_out_partial"),
                     dtype=np.float64)
    cg = np.asarray(gold.read("calls.0.core_gated"), dtype=np.float64)[..., 0:2, :]
    w = np.asarray(gold.read("weights.linear_attn.out_proj.weight"), dtype=np.float64)
    want = cg.reshape(*cg.shape[:-2], -1) @ w[:, : cg.shape[-2] * cg.shape[-1]].T
    whole = np.asarray(gold.read("calls.0.attn_out"), dtype=np.float64)
    d = got - want
    return float(np.abs(d).max() / np.abs(whole).max()), float(np.mean(d * d) / np.mean(whole * whole))


def test_the_summary_holds_each_ranks_figures_for_failing_and_passing_stages(sharded):
    """The failing rank's record: its figures, as recomputed here; a passing stage's: its worst rank of all."""
    c = _case(sharded, UNEVEN)
    first = next(r for r in c["records"] if r["verdict"] == "fail")
    s = first["shard"]
    assert (s["rank"], s["tensor"], s["share"]) == (0, "attn_out_partial", "the out_proj partial of value heads 0–1")
    err, nmse = _partial_error(sharded)
    assert s["max_err"] == pytest.approx(err, rel=1e-9) and s["nmse"] == pytest.approx(nmse, rel=1e-9)
    assert s["nmse"] / s["nmse_bound"] >= 10  # measured 34.8x in bf16
    passing = [r for r in _case(sharded, EVEN)["records"] if r["verdict"] == "pass"]
    assert passing and all(r["shard"]["of_ranks"] == 2 and r["shard"]["max_err"] <= r["shard"]["elem_bound"]
                           for r in passing)


def test_a_failing_sharded_case_shows_its_ranks_figures_in_the_metrics_table(sharded, sharded_report):
    page = _page(sharded_report, UNEVEN)
    first = page.find("tr", cls="first")
    f = next(r for r in _case(sharded, UNEVEN)["records"] if r["verdict"] == "fail")["shard"]
    cells = _cells(first)
    assert cells[:6] == ["out_proj", "attn_out", "rank 0", "attn_out_partial",
                         "the out_proj partial of value heads 0–1", "fail (sharded)"], cells
    assert cells[6:] == [fmt_num(f["max_err"]), fmt_num(f["elem_bound"]), "×" + fmt_num(f["max_err"] / f["elem_bound"]),
                         fmt_num(f["nmse"]), fmt_num(f["nmse_bound"]), "×" + fmt_num(f["nmse"] / f["nmse_bound"])]
    err, _ = _partial_error(sharded)
    assert cells[6] == fmt_num(err)  # the number a person reads is the rank's error, recomputed
    assert float(cells[-1][1:]) >= 10, cells  # the share's NMSE: 34.8x the bound, measured
    # every row of the case's tables has its numbers: none is a row of dashes
    for table in page.find_all("table", cls="ranks"):
        for row in table.find_all("tr")[1:]:
            assert "—" not in _cells(row)[6:9], _cells(row)
    assert len(page.find_all("table", cls="ranks")) == 2  # one a call, and no table of tensor metrics
    assert len(page.find_all("table", cls="metrics")) == 2


def test_the_first_divergence_names_its_rank_and_links_its_figures(sharded, sharded_report):
    page = _page(sharded_report, UNEVEN)
    box = page.find("div", id="first")
    assert "call 0, stage out_proj, tensor attn_out, rank 0: attn_out_partial (the out_proj partial of value " \
           "heads 0–1)" in box.text, box.text
    sections = page.find_all("section", cls="first")
    assert len(sections) == 1  # one first divergence, though five records share its call, tensor and stage
    link = box.find("a")
    assert link is not None and link.attrs["href"] == "#" + sections[0].attrs["id"]
    f = next(r for r in _case(sharded, UNEVEN)["records"] if r["verdict"] == "fail")["shard"]
    text = sections[0].find("div", cls="rank-figures").text
    assert "rank 0's attn_out_partial (the out_proj partial of value heads 0–1)" in text, text
    assert f"max err {fmt_num(f['max_err'])} of the whole tensor's scale · bound {fmt_num(f['elem_bound'])}" in text
    assert f"NMSE {fmt_num(f['nmse'])} (the share's" in text
    assert f"×{fmt_num(f['nmse'] / f['nmse_bound'])} the bound" in text
    # every failing rank's section says its rank: ranks 0 and 2 at the partial, every rank at attn_out
    heads = [s.find("h3").text for s in page.find_all("section")]
    assert sum("rank 2: attn_out_partial" in h for h in heads) == 2 and sum("rank 1: attn_out" in h for h in heads) == 2
    index = parse(sharded_report)
    assert "rank 0: attn_out_partial" in index.find("table", id="grid").text
    assert "(attn_out, call 0, rank 0)" in index.find("div", id="where").text


def test_a_passing_sharded_case_shows_its_worst_ranks_figures(sharded, sharded_report):
    page = _page(sharded_report, EVEN)
    records = {(r["call"], r["shard"]["tensor"]): r["shard"] for r in _case(sharded, EVEN)["records"]}
    rows = [_cells(r) for t in page.find_all("table", cls="ranks") for r in t.find_all("tr")[1:]]
    assert len(rows) == len(records) > 10
    g = next(r for r in rows if r[3] == "g")
    f = records[(0, "g")]
    assert g[2] == f"rank {f['rank']}, worst of 2" and g[5] == "pass"
    assert g[6] == f"{fmt_num(f['max_err'])} (log decay)" and g[8] == "×" + fmt_num(f["max_err"] / f["elem_bound"])
    assert all(r[5] == "pass" and r[6] != "—" and float(r[8][1:]) <= 1 for r in rows), rows


def test_the_text_and_markdown_summaries_give_the_ranks_ratios(sharded):
    f = next(r for r in _case(sharded, UNEVEN)["records"] if r["verdict"] == "fail")["shard"]
    said = f"NMSE {fmt_num(f['nmse'])} = ×{fmt_num(f['nmse'] / f['nmse_bound'])} the bound {fmt_num(f['nmse_bound'])}"
    line = next(x for x in text_summary(sharded.doc).splitlines() if x.startswith("FAIL"))
    assert "rank 0: attn_out_partial" in line and said in line, line
    md = markdown_summary(sharded.doc)
    assert "rank 0: attn\\_out\\_partial" in md or "rank 0: attn_out_partial" in md
    assert f"×{fmt_num(f['nmse'] / f['nmse_bound'])}" in md
