"""verify's fused mode (``fused=True``, ``gdncheck verify --fused``): a fused kernel's stage-isolated
outputs judged against the profile's end-to-end bounds. Outputs written from the goldens, with the
recurrent state moved by an error chosen between the two bounds (from the shipped table), so the
verdicts follow from the bounds alone: stage-isolated fails it, fused passes it; past the end-to-end
bound both fail. The tensor is the gated norm's output, whose bounds are furthest apart (a fused kernel
computes it last)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gdncheck.cli import main
from gdncheck.conformance.judge.records import validate_summary
from gdncheck.conformance.judge.tolerances import load_table
from gdncheck.conformance.judge.verify import verify
from tests.fixtures.outputs import case_entry, perfect_outputs

CASE = "chunked_T137"
TENSOR = "core_gated"


def _bounds(fixtures_dir):
    """(stage-isolated, end-to-end) bounds of call 0's tensor in f32, from the shipped table."""
    table, cid = load_table(), case_entry(fixtures_dir, CASE)["id"]
    return table.bound(TENSOR, "f32", "stage_isolated", cid), table.bound(TENSOR, "f32", "end_to_end", cid)


def _relative_error(fixtures_dir, where: str) -> float:
    """A relative error d of every element (NMSE d^2): between the two NMSE bounds (their geometric mean),
    and under the end-to-end element bound; or, ``beyond``, an NMSE four times the end-to-end bound."""
    stage, e2e = _bounds(fixtures_dir)
    return (stage.nmse * e2e.nmse) ** 0.25 if where == "between" else 2 * e2e.nmse ** 0.5


def _outputs(fixtures_dir, out, d: float):
    """Stage-isolated outputs of the golden, call 0's tensor scaled by 1 + d."""
    def alter(t):
        t[f"calls.0.{TENSOR}"] = (t[f"calls.0.{TENSOR}"].astype(np.float64) * (1 + d)).astype(np.float32)
    perfect_outputs(fixtures_dir, CASE, out, alter=alter, meta={"mode": "stage_isolated"})


def test_the_bounds_leave_room_between_stage_and_end_to_end(fixtures_dir):
    stage, e2e = _bounds(fixtures_dir)
    assert 0 < 8 * stage.nmse < e2e.nmse and stage.elem < e2e.elem
    assert _relative_error(fixtures_dir, "between") < e2e.elem / 4  # its element errors stay under e2e's bound


@pytest.mark.parametrize("where, stage_verdict, fused_verdict", [
    ("between", "fail", "pass"),  # a fused kernel's inherited rounding: only the whole layer's bounds grant it
    ("beyond", "fail", "fail"),  # past the end-to-end bound: no mode grants it
])
def test_fused_judges_against_the_end_to_end_bounds(fixtures_dir, tmp_path, where, stage_verdict, fused_verdict):
    _, e2e = _bounds(fixtures_dir)
    _outputs(fixtures_dir, tmp_path, _relative_error(fixtures_dir, where))
    iso = verify(fixtures_dir, tmp_path, "f32", cases=[CASE], stage_isolated=True)
    fused = verify(fixtures_dir, tmp_path, "f32", cases=[CASE], fused=True)
    [ci], [cf] = iso.cases, fused.cases
    assert (ci.status, cf.status) == (stage_verdict, fused_verdict), (ci.message, cf.message)
    rec = next(r for r in cf.records if r.call == 0 and r.tensor == TENSOR)
    assert rec.bound["mode"] == "end_to_end" and rec.bound["nmse"] == pytest.approx(e2e.nmse)
    assert next(r for r in ci.records if r.call == 0 and r.tensor == TENSOR).bound["mode"] == "stage_isolated"
    assert fused.mode == "stage_isolated" and fused.bounds == "end_to_end" and iso.bounds is None
    assert "--fused" in cf.repro and "--stage-isolated" not in cf.repro
    doc = fused.to_json()
    assert doc["bounds"] == "end_to_end" and "bounds" not in iso.to_json()
    validate_summary(doc)
    assert any(n.startswith("fused: ") for n in doc["notes"])


def test_the_command_line_says_fused_and_writes_it(fixtures_dir, tmp_path, capsys):
    _outputs(fixtures_dir, tmp_path / "o", _relative_error(fixtures_dir, "between"))
    summary = tmp_path / "s.json"
    rc = main(["verify", "--fixtures", str(fixtures_dir), "--outputs", str(tmp_path / "o"), "--profile", "f32",
               "--fused", "--case", CASE, "--summary", str(summary)])
    out = capsys.readouterr().out
    assert rc == 0 and "stage_isolated, end-to-end bounds (fused)" in out, out
    doc = json.loads(summary.read_text())
    assert doc["mode"] == "stage_isolated" and doc["bounds"] == "end_to_end" and doc["verdict"] == "conforms"
    rc = main(["verify", "--fixtures", str(fixtures_dir), "--outputs", str(tmp_path / "o"), "--profile", "f32",
               "--stage-isolated", "--case", CASE, "--summary", str(tmp_path / "s2.json")])
    assert rc == 1  # the same outputs, the stage bounds: the error is over them
