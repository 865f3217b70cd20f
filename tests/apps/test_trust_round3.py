"""Trust, third round (issue 37): no known-failures file, tolerance table or flag turns "judged
nothing" into a pass; known-failure entries that match nothing are reported; a table that lacks a
shipped bound loosens by name only; a bad manifest entry or a bad count is exit 2, one line.

Each test failed on main at 9614803 (the figures: the commit that added this file)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from gdncheck.cli import main
from gdncheck.conformance.judge.records import validate_summary
from gdncheck.conformance.judge.tolerances import TABLE_PATH
from gdncheck.conformance.ports.run import run_impl
from gdncheck.gate import GateOptions, run_gate, validate_gate_summary
from tests.apps.plugins import never_applicable, not_implemented
from tests.fixtures.outputs import case_entry, perfect_outputs

NEVER = "tests.apps.plugins:never_applicable"
REQUIRED = ["prefill_T1_", "decode_T12"]  # cases every port must run
NOT_IMPLEMENTED = "".join(f"* f32 {c} *  # not implemented yet\n" for c in REQUIRED)


def _verify(capsys, outputs, *args) -> tuple[int, str, str, dict | None]:
    code = main(["verify", "--outputs", str(outputs), "--profile", "f32", "--diagnose", "0", *map(str, args)])
    cap = capsys.readouterr()
    path = outputs / "verify-summary-f32.json"
    doc = json.loads(path.read_text()) if path.is_file() else None
    return code, cap.out, cap.err, doc


def _cases(*ids):
    return [a for c in ids for a in ("--case", c)]


# --- 1. known failures never make "nothing judged" or "coverage not met" a pass ---------------------

def test_not_implemented_entries_never_pass_a_port_that_declares_everything_not_applicable(tmp_path, capsys):
    out = tmp_path / "na"
    run_impl(never_applicable, "fixtures/default", out, "f32", cases=[*REQUIRED, "snapshot-replay"])
    (tmp_path / "x.txt").write_text(NOT_IMPLEMENTED)
    code, text, _, doc = _verify(capsys, out, "--xfails", tmp_path / "x.txt", *_cases(*REQUIRED, "snapshot-replay"))
    assert code == 1 and doc["verdict"] == "does not conform", text
    validate_summary(doc)  # what `gdncheck report` checks first: it refused this summary before
    assert doc["coverage"]["ok"] is False and not doc["xfails"]["known_failures"]
    assert [r["why"] for r in doc["xfails"]["refused"]] == ["it declared not applicable a case every port must run"] * 2
    assert text.count("FAIL  ") == 2 and "does not excuse case prefill_T1_" in text
    assert main(["report", str(out / "verify-summary-f32.json"), "-o", str(tmp_path / "rep"), "-q"]) == 0


def test_star_entries_never_pass_a_port_that_computes_nothing(tmp_path, capsys):
    out = tmp_path / "ni"
    run_impl(not_implemented, "fixtures/default", out, "f32", cases=REQUIRED)
    (tmp_path / "x.txt").write_text(NOT_IMPLEMENTED)
    code, text, _, doc = _verify(capsys, out, "--xfails", tmp_path / "x.txt", *_cases(*REQUIRED))
    validate_summary(doc)
    assert code == 2 and doc["verdict"] == "nothing judged", text
    assert len(doc["xfails"]["known_failures"]) == 2 and doc["coverage"]["tensors_judged"] == 0
    assert "no case passed" in doc["coverage"]["problems"][0]


def test_the_gate_never_passes_on_known_failures_of_nothing(tmp_path):
    (tmp_path / "x.txt").write_text("* f32 prefill_T1_ *  # not implemented yet\n* f32 prefil_T1_ *  # a typo\n"
                                    "* bf16 snapshot-replay *  # a profile the run has not\n")
    res = run_gate(GateOptions(impl=NEVER, profiles=("f32",), cases=["prefill_T1_", "snapshot-replay"],
                               out=str(tmp_path / "out"), properties=False, jobs=1, rebuild_check=False,
                               xfails=str(tmp_path / "x.txt")))
    validate_gate_summary(res.doc)
    assert res.exit_code == 1 and res.doc["profiles"]["f32"]["coverage"]["ok"] is False
    (r,) = res.doc["xfails"]["refused"]
    assert r["case"].startswith("prefill_T1_") and r["profile_run"] == "f32"
    assert [(x["line"], x["why"]) for x in res.doc["xfails"]["unmatched"]] == [
        (2, "no case of the suite starts with 'prefil_T1_'"), (3, "profile bf16; this run's: f32")]


# --- 2. entries that match nothing, a byte-order mark, duplicates ------------------------------------

@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    """A perfect port's outputs of two required cases."""
    out = tmp_path_factory.mktemp("golden")
    for c in REQUIRED:
        perfect_outputs("fixtures/default", c, out)
    return out


def test_entries_that_match_no_case_are_listed(golden, tmp_path, capsys):
    (tmp_path / "x.txt").write_text("* f32 decod_T12 *  # a typo\n"
                                    "* bf16 prefill_T1_ *  # another profile\n"
                                    "otherport * prefill_T1_ *  # another implementation\n"
                                    "* f32 chunked_ *  # not selected: no finding\n")
    code, text, _, doc = _verify(capsys, golden, "--xfails", tmp_path / "x.txt", *_cases(*REQUIRED))
    assert code == 0, text
    whys = {x["line"]: x["why"] for x in doc["xfails"]["unmatched"]}
    assert whys == {1: "no case of the suite starts with 'decod_T12'", 2: "profile bf16; this run's: f32",
                    3: "implementation 'otherport'; this run's: golden copy"}
    (note,) = [n for n in doc["notes"] if "match no case of this run" in n]
    assert note.startswith("3 known-failure entry(ies) match no case") and "x.txt:1 (no case" in note
    assert "3 known-failure entry(ies) matching no case" in text


@pytest.mark.parametrize("body, why", [
    ("* f32 * *  # every case\n", "expected CASE a case id or id prefix, found '*'"),
    ("* f32 decode out  # one\n* f32 decode core  # two\n",
     ":2: a second entry for * f32 decode (the first is line 1)"),
])
def test_a_star_case_and_a_duplicate_are_exit_2(golden, tmp_path, capsys, body, why):
    (tmp_path / "x.txt").write_text(body)
    code, _, err, _ = _verify(capsys, golden, "--xfails", tmp_path / "x.txt")
    assert code == 2 and len(err.strip().splitlines()) == 1 and why in err, err


def test_a_byte_order_mark_does_not_disable_the_first_entry(tmp_path, capsys):
    def broken(t):
        t["calls.0.out"] = t["calls.0.out"] * 2.0

    out = tmp_path / "o"
    out.mkdir()
    perfect_outputs("fixtures/default", "decode_T12", out, alter=broken)
    perfect_outputs("fixtures/default", "prefill_T1_", out)
    (tmp_path / "x.txt").write_bytes("* f32 decode_T12 *  # issue 7\n".encode("utf-8-sig"))
    code, text, _, doc = _verify(capsys, out, "--xfails", tmp_path / "x.txt", *_cases(*REQUIRED))
    assert code == 0 and [k["line"] for k in doc["xfails"]["known_failures"]] == [1], text


# --- 3. a tolerance table with rows deleted, or a bound missing ---------------------------------------

def _table(tmp_path, name, edit) -> str:
    table = json.loads(TABLE_PATH.read_text())
    for profiles in table["modes"].values():
        for sections in profiles.values():
            edit(sections)
    path = tmp_path / name
    path.write_text(json.dumps(table))
    return str(path)


def test_a_table_without_its_case_rows_is_looser(tmp_path, capsys):
    """A real error in `out` (scaled 3.9e-6) the shipped bound of decode_T12 (1.52e-6) fails; the table
    with its case rows emptied judged it against the global envelope (2.45e-5): conforms, looser_bounds 0."""
    def nudge(t):
        a = t[[k for k in t if k.endswith(".out")][-1]]  # the last call's
        a[np.unravel_index(np.argmax(np.abs(a)), a.shape)] *= 1 + 5e-6

    out = tmp_path / "o"
    out.mkdir()
    perfect_outputs("fixtures/default", "decode_T12", out, alter=nudge)
    code, text, _, doc = _verify(capsys, out, "--case", "decode_T12")
    assert code == 1 and doc["cases"][0]["first_divergence"]["tensor"] == "out", text
    norows = _table(tmp_path, "norows.json", lambda s: s.update(cases={}))
    code, _, err, _ = _verify(capsys, out, "--case", "decode_T12", "--tolerances", norows)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "loosens" in err, err
    assert "end_to_end f32 decode_T12_Hk2_Hv4_dk16_dv16 out" not in err or "shipped row is missing" in err
    code, text, _, doc = _verify(capsys, out, "--case", "decode_T12", "--tolerances", norows,
                                 "--allow-looser-tolerances")
    assert code == 0 and doc["tolerances"]["looser_bounds"] > 0, text  # allowed by name only, and said
    assert "with a tolerance table looser than the shipped one at" in text


def test_a_table_missing_a_bound_is_exit_2_and_one_line(golden, tmp_path, capsys):
    def drop_out(s):
        s["global"].pop("out", None)
        s.get("properties", {}).pop("out", None)
        for row in s["cases"].values():
            row.pop("out", None)

    noout = _table(tmp_path, "noout.json", drop_out)
    code, text, err, _ = _verify(capsys, golden, "--tolerances", noout, *_cases(*REQUIRED))
    assert code == 2 and len(err.strip().splitlines()) == 1, text + err
    assert "has no bound for 'out'" in err and "please report" not in text + err
    assert main(["tolerances", "show", "--table", noout]) == 2


# --- 5. smaller: a count, an error-only selection, a colliding snapshot name -------------------------

def test_a_negative_diagnose_is_a_usage_error(golden, capsys):
    with pytest.raises(SystemExit) as info:
        main(["verify", "--outputs", str(golden), "--profile", "f32", "--diagnose", "-1"])
    assert info.value.code == 2
    assert "expected a number of cases (0 or more), found '-1'" in capsys.readouterr().err


def test_only_expected_errors_of_a_broken_port_is_nothing_judged(tmp_path, capsys):
    """A port whose every number is wrong, but which refuses bad input: `--tag error` conformed."""
    out = tmp_path / "o"
    run_impl("gdncheck.conformance.meta.mutants:norm_weight_plain", "fixtures/default", out, "f32", tags=["error"])
    code, text, _, doc = _verify(capsys, out, "--tag", "error")
    assert code == 2 and doc["verdict"] == "nothing judged", text
    assert doc["totals"]["passed"] > 0 and doc["coverage"]["tensors_judged"] == 0
    assert any(p.startswith("no tensor was judged") for p in doc["coverage"]["problems"])


def test_a_colliding_snapshot_name_is_a_bad_manifest_entry(tmp_path, capsys):
    """A save step named like another case's outputs file: verify read the outputs file as the
    snapshot, a port failure (exit 1); it is the manifest's fault (exit 2), as `run` says."""
    suite = tmp_path / "suite"
    suite.mkdir()
    raw = json.loads((TABLE_PATH.parents[2] / "fixtures" / "default" / "manifest.json").read_text())
    keep = [case_entry("fixtures/default", c) for c in ("snapshot-replay", "prefill_T1_")]
    raw["cases"] = [c for c in raw["cases"] if c["id"] in {k["id"] for k in keep}]
    snap, prefill = raw["cases"] if raw["cases"][0]["id"].startswith("snapshot") else raw["cases"][::-1]
    for step in snap["program"]:
        if step["op"] in ("save", "load"):
            step["file"] = f"{prefill['id']}.safetensors"
    for c in raw["cases"]:
        shutil.copy(f"fixtures/default/{c['file']}", suite / c["file"])
    (suite / "manifest.json").write_text(json.dumps(raw))
    out = tmp_path / "o"
    run_impl("reference", "fixtures/default", out, "f32", cases=["snapshot-replay", "prefill_T1_"])
    code, text, _, doc = _verify(capsys, out, "--fixtures", suite)
    assert code == 2 and doc["verdict"] == "inputs unusable", text
    status = {c["id"].split("_")[0]: (c["status"], c["problem"]) for c in doc["cases"]}
    assert status["prefill"] == ("pass", None)
    assert status["snapshot-replay"][0] == "error"
    assert "manifest entry unusable: the snapshot file of step" in status["snapshot-replay"][1]
    assert f"which is also the outputs file of case {prefill['id']}" in status["snapshot-replay"][1]
