"""verify's console for a port judged through a name table and for a port that declares cases not
applicable (issue 37, item 12): a group of failing cases is labelled with what their own lines say
(an ambiguous diagnosis names its classes, never "the diagnosis failed"); the not-applicable count
gives what the port declared, in its words; a name table's note is said once for the run, with the
number of cases it holds for, not under every case."""

from __future__ import annotations

import pytest

from gdncheck.cli import main
from gdncheck.commands.grouping import cause_label, failure_groups
from gdncheck.conformance.ports.run import run_impl
from tests.apps.plugins import dk_eq_dv_only
from tests.ports.test_names import rename_outputs


def test_an_ambiguous_diagnosis_is_grouped_by_its_classes():
    d = {"verdict": "ambiguous", "bug_class": "gate before norm", "alternatives": ["norm without weight"],
         "residual": 0.01, "text": "ambiguous: gate before norm or norm without weight (residual 0.01; this case "
                                   "cannot tell them apart)"}
    assert cause_label(d) == "ambiguous: gate before norm or norm without weight"
    assert "failed" not in cause_label(d)
    assert cause_label({"verdict": "error", "text": "no diagnosis: ValueError: x"}) == \
        "no diagnosis (the diagnosis failed: see the case)"
    doc = {"cases": [{"id": f"c{i}", "status": "fail", "records": [], "diagnosis": d,
                      "first_divergence": {"step": 1, "call": 0, "op": "forward", "stage": "gated_norm",
                                           "tensor": "core_gated", "token": 0, "position": 0, "row": 0,
                                           "reason": "elem_bound"}} for i in range(2)]}
    lines = failure_groups(doc).lines()
    assert "  2 likely cause: ambiguous: gate before norm or norm without weight" in lines


def test_not_applicable_count_says_what_the_port_declared(fixtures_dir, tmp_path, capsys):
    cases = ["dk-gt-dv", "dk-lt-dv", "prefill_T1_"]
    run_impl(dk_eq_dv_only, fixtures_dir, tmp_path, "f32", cases=cases)
    code = main(["verify", "--outputs", str(tmp_path), "--profile", "f32", *[a for c in cases for a in ("--case", c)]])
    out = capsys.readouterr().out
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("coverage: "))
    assert ('2 not applicable (as the port declared: "dk = 16 != dv = 8: this port runs dk = dv only" 1, '
            '"dk = 8 != dv = 16: this port runs dk = dv only" 1)') in line
    assert "optional features" not in line


@pytest.fixture(scope="module")
def metrale_port(tmp_path_factory):
    base = tmp_path_factory.mktemp("metrale-console")
    from gdncheck.fixtures.manifest import DEFAULT_DIR

    run_impl("reference", DEFAULT_DIR, base / "canon", "f32", cases=["snapshot-replay", "prefill-decode_T65"])
    rename_outputs(base / "canon", base / "m", "metrale")
    return base / "m"


def test_a_name_table_note_is_said_once_for_the_run(metrale_port, capsys):
    code = main(["verify", "--outputs", str(metrale_port), "--profile", "f32", "--case", "snapshot-replay", "--case",
                 "prefill-decode_T65", "--names", "metrale", "--summary", str(metrale_port.parent / "s.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    notes = [x for x in out.splitlines() if "not compared (metrale name table)" in x]
    assert len(notes) == 1 and notes[0].startswith("note (2 of 2 case(s)): not compared (metrale name table): gates:")
    assert out.index(notes[0]) < out.index("coverage: ")  # with the run's notes, before the verdict


def test_a_not_applicable_line_counts_the_tensors_that_passed(fixtures_dir, tmp_path, capsys):
    """Its "the N tensor(s) of the steps before it pass" counted the tensors not written too."""
    from tests.fixtures.outputs import perfect_outputs

    def drop_q(t):
        del t["calls.0.q"], t["calls.0.k"]

    perfect_outputs(fixtures_dir, "snapshot-replay", tmp_path, alter=drop_q,
                    meta={"not_applicable": "no snapshot files", "not_applicable_step": "3"})
    code = main(["verify", "--outputs", str(tmp_path), "--profile", "f32", "--case", "snapshot-replay",
                 "--summary", str(tmp_path / "s.json")])
    out = capsys.readouterr().out
    import json

    (case,) = json.loads((tmp_path / "s.json").read_text())["cases"]
    assert code == 2 and case["status"] == "not_applicable" and case["counts"]["missing"] == 2
    assert f"the {case['counts']['pass']} tensor(s) of the steps before it pass" in out
    assert '1 not applicable (as the port declared: "no snapshot files" 1)' in out
