"""The report stays bounded on a summary no verify wrote (issue 43, item 6): a record's per-token profile of
2 million points (verify writes 64) took ``gdncheck report`` 202 s (over 300 s on a loaded machine); it is
max-pooled to MAX_PROFILE_POINTS before the schema check reads it, keeping each bucket's largest error, an
inf and a NaN, and a curve draws at most MAX_PLOT_POINTS points."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from gdncheck.reports import plots
from gdncheck.reports.model import MAX_PROFILE_POINTS, ReportInputError, load_summary

N = 2_000_000
SPIKE, NAN_AT = 1_234_567, 1_999_998


def _inflated(doc: dict) -> dict:
    doc = json.loads(json.dumps(doc))
    rec = next(r for c in doc["cases"] for r in c["records"] if r.get("token_profile"))
    values: list = [1e-3 * ((i * 7919) % 1000) for i in range(N)]
    values[SPIKE], values[NAN_AT] = 5.0, "nan"
    rec["token_profile"] = {"token": list(range(N)), "max_err": values}
    return doc


def test_a_two_million_point_profile_is_pooled_keeping_its_peak_and_nan(tiled, tmp_path):
    doc = _inflated(tiled.doc)
    t0 = time.monotonic()
    checked = load_summary(doc)
    took = time.monotonic() - t0
    (tp,) = [r["token_profile"] for c in checked["cases"] for r in c["records"]
             if r.get("token_profile") and len(r["token_profile"]["token"]) > 64]
    assert len(tp["token"]) == len(tp["max_err"]) <= MAX_PROFILE_POINTS
    k = math.ceil(N / MAX_PROFILE_POINTS)
    assert tp["token"] == list(range(0, N, k))  # each bucket's first token
    finite = [v for v in tp["max_err"] if v != "nan"]
    assert max(finite) == 5.0 and tp["max_err"][SPIKE // k] == 5.0 and tp["max_err"][NAN_AT // k] == "nan"
    assert took < 60, f"{took:.0f} s"


def test_the_report_on_it_takes_seconds_not_minutes(tiled, tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(_inflated(tiled.doc)))
    t0 = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "gdncheck", "report", str(path), "-o", str(tmp_path / "site"),
                               "-q"], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("gdncheck report ran past 120 s on a 2-million-point profile")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 < 120


def test_a_long_profile_that_is_not_numbers_is_one_line():
    profile = {"token": list(range(5000)), "max_err": [1.0] * 4999}
    doc = {"cases": [{"id": "c", "records": [{"token_profile": profile}]}]}
    from gdncheck.reports.model import bound_profiles

    with pytest.raises(ReportInputError, match="5000 tokens and 4999 values"):
        bound_profiles(doc)
    doc["cases"][0]["records"][0]["token_profile"]["max_err"] = ["x"] * 5000
    with pytest.raises(ReportInputError, match="integer tokens and numbers"):
        bound_profiles(doc)


def test_a_curve_draws_at_most_its_points_keeping_the_peak():
    tokens = np.arange(100_000)
    values = np.full(100_000, 1e-3)
    values[77_777] = 9.0
    svg = plots.drift(tokens, values, 1e-2)
    assert svg.count("L") + svg.count("H") + svg.count("V") < 8 * plots.MAX_PLOT_POINTS
    t, v = plots.max_pooled(tokens, values, plots.MAX_PLOT_POINTS)
    assert len(t) <= plots.MAX_PLOT_POINTS and v.max() == 9.0
