"""A verify summary's JSON, built in one walk (records.py's ``_clean``), is what ``dataclasses.asdict``
then cleaning made: every field, non-finite numbers as strings, tuples as lists, nested dataclasses as
dicts, the record's ``failure`` left out, and new containers (the document never aliases a record)."""

from __future__ import annotations

import math
from dataclasses import asdict

from gdncheck.conformance.judge.records import CaseReport, FirstDivergence, Record, Summary


def _slow_clean(value):  # the earlier serialisation, as an independent oracle
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _slow_clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_slow_clean(v) for v in value]
    return value


def _record(i: int) -> Record:
    return Record(case="c", step=i, op="forward", call=i, tensor="core", stage="delta_rule", stage_index=5,
                  verdict="fail", reason="nan", message="core: 1 NaN", dtype="F32", shape=(1, 2, 3),
                  metrics={"max_err": float("inf"), "nmse": float("nan"), "neg": -math.inf, "ok": 1.5,
                           "rows": [(0, float("nan")), [1, 2.0]]},
                  bound={"elem": 1e-3, "nested": {"x": (float("-inf"),)}}, token_profile={"t": [0.5, math.inf]},
                  failure=object())


def test_record_json_is_asdict_then_clean():
    rec = _record(0)
    want = asdict(rec)
    del want["failure"]
    want = _slow_clean(want)
    got = rec.to_json()
    assert got == want and list(got) == list(want)
    assert got["metrics"]["max_err"] == "inf" and got["metrics"]["nmse"] == "nan" and got["shape"] == [1, 2, 3]
    got["metrics"]["ok"] = 99.0
    got["bound"]["nested"]["x"].append(1)
    assert rec.metrics["ok"] == 1.5 and rec.bound["nested"]["x"] == (float("-inf"),)  # no aliasing


def test_case_and_summary_json_are_asdict_then_clean():
    fd = FirstDivergence(1, 1, "forward", "delta_rule", "core", 3, 7, 0, "nan")
    case = CaseReport("c", "prefill", ["t"], "fail", first_divergence=fd, records=[_record(0), _record(1)],
                      diagnosis={"score": float("nan"), "pair": (1, 2)}, serving=[{"cu": (0, 3)}])
    want = {k: v for k, v in asdict(case).items() if k != "records"}
    want["records"] = [_slow_clean({k: v for k, v in asdict(r).items() if k != "failure"}) for r in case.records]
    want["judged"] = 2
    want = _slow_clean(want)
    assert case.to_json() == want and case.to_json()["first_divergence"]["token"] == 3
    s = Summary("f32", "end_to_end", {"name": "x"}, {"sha256": "0"}, {"dir": "d"}, {"dir": "o"}, {}, {},
                cases=[case], xfails={"entries": (float("inf"),)})
    doc = s.to_json()
    assert doc["cases"] == [want] and doc["xfails"] == {"entries": ["inf"]}
    assert list(doc)[-1] == "cases" and doc["totals"]["records_failed"] == 2
