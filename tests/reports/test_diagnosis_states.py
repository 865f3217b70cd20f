"""A report renders whatever diagnosis verify wrote: a case past the diagnosis limit is 'skipped'
with no candidate (the report once crashed on it under StrictUndefined, whenever more than eight cases
failed: the usual failing port), a diagnosis that raised is 'error', one that found nothing is 'none'."""

from __future__ import annotations

import copy

from gdncheck.conformance.judge.diagnose import Diagnoser
from gdncheck.conformance.judge.verify import verify
from gdncheck.reports import write_report
from gdncheck.reports.model import build

from .conftest import TILED_CASES
from .pages import parse


def _failing(doc):
    return [c for c in doc["cases"] if c["status"] == "fail"]


def test_cases_past_the_diagnosis_limit_render(tiled, tmp_path):
    """The real path: verify with a limit of one diagnosis on two failing cases, then the report."""
    summary = verify(tiled.fixtures, tiled.outputs, "bf16", cases=TILED_CASES, diagnose=Diagnoser(limit=1))
    doc = summary.to_json()
    states = sorted(c["diagnosis"]["verdict"] for c in _failing(doc))
    assert len(states) == 2 and states[-1] == "skipped", states
    index = write_report(doc, tmp_path / "site")
    for case in build(doc).cases:
        if (case.raw.get("diagnosis") or {}).get("verdict") == "skipped":
            page = parse(index.parent / "cases" / f"{case.page}.html")
            cause = page.find(id="likely-cause")
            assert cause is not None and "not diagnosed (only the first 1 failing cases are)" in cause.text
            assert "candidate" not in cause.text  # a skipped diagnosis names none


STATES = {
    "skipped": {"verdict": "skipped", "text": "not diagnosed (only the first 8 failing cases are)",
                "tensor": "core", "call": 0},
    "error": {"verdict": "error", "text": "no diagnosis: ValueError: boom", "tensor": None, "call": None},
    "none": {"verdict": "none", "text": "no known bug class matches", "tensor": "core", "call": 0,
             "candidate": None, "source": None, "residual": None},
    "matches": {"verdict": "matches", "text": "head grouping tiled", "tensor": "core", "call": 1,
                "candidate": "head_grouping_tiled", "source": "transform", "residual": 0.01},
}


def test_every_diagnosis_state_renders(tiled, tmp_path):
    """Hand-made summaries at the edges: each state on every failing case, and no diagnosis at all."""
    for name, diag in [*STATES.items(), ("absent", None)]:
        doc = copy.deepcopy(tiled.doc)
        for c in _failing(doc):
            if diag is None:
                c.pop("diagnosis", None)
            else:
                c["diagnosis"] = dict(diag)
        index = write_report(doc, tmp_path / name)
        for case in build(doc).cases:
            if case.status != "fail":
                continue
            cause = parse(index.parent / "cases" / f"{case.page}.html").find(id="likely-cause")
            if diag is None:
                assert cause is None, name
                continue
            assert cause is not None and diag["text"] in cause.text, name
            assert ("candidate head_grouping_tiled" in cause.text) == (name == "matches"), name
