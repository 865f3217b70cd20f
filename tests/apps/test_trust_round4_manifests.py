"""Trust, fourth round (issue 43), the manifest's own promises and known failures through the command line:
an edited manifest that judges less than its case files hold is a bad entry (exit 2, one line naming the
case), never a pass; a run passes only if a case that judged tensors passed; a serving entry the reference
refuses is refused before anything runs; a 5000-digit step in an outputs file is unusable input, not a
gdncheck bug; `fixtures check` reports every bad entry and checks the rest, as verify judges them.

Each test failed on main at ad695e6 (the figures: /work/notes/inputs.md, the commit that added this file)."""

from __future__ import annotations

import json

import pytest

from gdncheck.cli import main
from gdncheck.conformance.ports.run import run_impl
from tests.fixtures.outputs import case_entry, perfect_outputs

MUTANT = "gdncheck.conformance.meta.mutants:norm_weight_plain"  # every number wrong, bad input refused
PREFILL, DECODE, REFUSED = "prefill_T1_", "decode_T12", "error-input-dtype"


def _verify(capsys, outputs, *args) -> tuple[int, str, str, dict | None]:
    summary = outputs.parent / f"summary-{outputs.name}.json"
    code = main(["verify", "--outputs", str(outputs), "--profile", "f32", "--diagnose", "0", "--summary",
                 str(summary), *map(str, args)])
    cap = capsys.readouterr()
    doc = json.loads(summary.read_text()) if summary.is_file() else None
    return code, cap.out, cap.err, doc


def _cases(*ids):
    return [a for c in ids for a in ("--case", c)]


def _edit_manifest(suite, change) -> dict:
    path = suite / "manifest.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    return doc


def _entry(doc, prefix):
    return next(c for c in doc["cases"] if c["id"].startswith(prefix))


# --- item 2: a manifest edit that judges less ------------------------------------------------------------

@pytest.fixture()
def perfect(fixture_copy, tmp_path):
    """A perfect port's outputs of two required cases (made before the manifest is edited)."""
    out = tmp_path / "perfect"
    out.mkdir()
    for c in (PREFILL, DECODE):
        perfect_outputs(fixture_copy, c, out)
    return out


def _expect_nothing(doc):
    for c in doc["cases"]:
        for s in c["program"]:
            if "expected" in s:
                s["expected"] = []


def test_steps_that_expect_nothing_are_bad_entries_not_a_pass(fixture_copy, tmp_path, capsys):
    """Before: every step `"expected": []`, a broken port judged on seq_len only: "conforms", exit 0."""
    out = tmp_path / "mutant"
    run_impl(MUTANT, str(fixture_copy), out, "f32", cases=[PREFILL, DECODE, REFUSED])
    _edit_manifest(fixture_copy, _expect_nothing)
    code, text, _, doc = _verify(capsys, out, "--fixtures", fixture_copy, *_cases(PREFILL, DECODE, REFUSED))
    assert code == 2 and doc["verdict"] == "inputs unusable", text
    status = {c["id"].split("_")[0]: (c["status"], c.get("problem")) for c in doc["cases"]}
    assert status["prefill"][0] == status["decode"][0] == "error" and status["error-input-dtype"][0] == "pass"
    assert "manifest entry is inconsistent: step 1 (forward) does not expect 'out', which coverage.required " \
           "names" in status["prefill"][1]
    assert doc["coverage"]["tensors_judged"] == 0
    lines = [ln for ln in text.splitlines() if ln.startswith("ERROR ")]
    assert len(lines) == 2 and all("does not expect 'out'" in ln for ln in lines)


@pytest.mark.parametrize(("change", "words"), [
    # the case file holds calls.0.core, the entry no longer judges it (required tensors left in place)
    (lambda e: e["program"][1].update(expected=[t for t in e["program"][1]["expected"] if t != "core"]),
     "holds calls.0.core, but step 1 (forward) does not expect 'core'"),
    # its only call removed: nothing of the case judged, the case file still holds the call's goldens
    (lambda e: e["program"].pop(), "holds calls.0.a, but the program has no call 0"),
    # required emptied with the steps: the case's kind says what it requires
    (lambda e: (e["program"][1].update(expected=[]), e["coverage"].update(required=[])),
     "coverage.required [] is not what a forward case requires"),
    # a feature added: a port could declare a case every port must run not applicable
    (lambda e: e["coverage"]["features"].append("snapshot_files"), "'snapshot_files' is not exercised"),
    # flipped to an error case the port "passes" by raising
    (lambda e: e.update(kind="error", expected_error={"code": "input_dtype", "step": 1,
                                                       "accept": ["input_dtype", "input_error"]},
                        coverage={"features": [], "required": []}),
     "holds calls.0.a, but step 1 (forward) does not expect 'a'"),
])
def test_an_entry_that_judges_less_than_its_case_file_is_unusable(fixture_copy, perfect, capsys, change, words):
    """Before: each of these passed a perfect port's outputs (exit 0), judging less than the case holds."""
    doc = _edit_manifest(fixture_copy, lambda d: change(_entry(d, PREFILL)))
    code, text, _, summary = _verify(capsys, perfect, "--fixtures", fixture_copy, *_cases(PREFILL, DECODE))
    assert code == 2, text
    by = {c["id"]: c for c in summary["cases"]}
    bad = by[_entry(doc, PREFILL)["id"]]
    assert bad["status"] == "error" and "manifest entry is inconsistent" in bad["problem"]
    assert words in bad["problem"], bad["problem"]
    assert by[_entry(doc, DECODE)["id"]]["status"] == "pass"  # the other case still judged


def test_an_entry_renamed_to_another_case_id_is_unusable(fixture_copy, tmp_path, capsys):
    """A case id names the tolerances' recipe and the known failures' entries: before, an entry renamed
    (its case file untouched) was judged under the new id, exit 0."""
    old = case_entry(fixture_copy, DECODE)["id"]
    _edit_manifest(fixture_copy, lambda d: _entry(d, DECODE).update(id="renamed-" + old))
    out = tmp_path / "o"
    out.mkdir()
    perfect_outputs(fixture_copy, "renamed-", out)
    code, text, _, summary = _verify(capsys, out, "--fixtures", fixture_copy, "--case", "renamed-")
    (case,) = summary["cases"]
    assert code == 2 and case["status"] == "error", text
    assert f"manifest entry is inconsistent with its case file: {old}.safetensors holds case {old!r}, but the " \
           f"entry's id is 'renamed-{old}'" == case["problem"]


# --- item 3: known failures that excuse every computing case --------------------------------------------

def test_wildcard_known_failures_beside_expected_errors_are_no_pass(tmp_path, capsys):
    """Before: `* * <letter> *` lines excused every failing case of a mutant, an expected-error case
    passed, and verify said "conforms", exit 0."""
    out = tmp_path / "mutant"
    run_impl(MUTANT, "fixtures/default", out, "f32", cases=[PREFILL, DECODE, REFUSED])
    (tmp_path / "x.txt").write_text("* * p *  # any\n* * d *  # any\n")
    code, text, _, doc = _verify(capsys, out, "--xfails", tmp_path / "x.txt", *_cases(PREFILL, DECODE, REFUSED))
    assert code == 1 and doc["verdict"] == "does not conform", text
    assert len(doc["xfails"]["known_failures"]) == 2 and doc["totals"]["passed"] == 1
    (problem,) = doc["coverage"]["problems"]
    assert problem.startswith("no case passed that judged a tensor: of the 3 case(s) of the port judged, 2 are "
                              "known failures (--xfails) and 1 passed judging no tensor (expected errors)")
    assert any("excuse every one of the 2 failing case(s), 2 of them by entries whose WHAT is '*'" in n
               for n in doc["notes"])


def test_a_known_failure_beside_a_computing_pass_still_conforms(tmp_path, capsys):
    """The rule holds a run to one case that computed and passed, nothing more."""
    out = tmp_path / "o"
    out.mkdir()
    perfect_outputs("fixtures/default", PREFILL, out)
    perfect_outputs("fixtures/default", DECODE, out, alter=lambda t: t.update({"calls.0.out": t["calls.0.out"] * 2}))
    (tmp_path / "x.txt").write_text(f"* f32 {DECODE} out  # issue 7\n")
    code, text, _, doc = _verify(capsys, out, "--xfails", tmp_path / "x.txt", *_cases(PREFILL, DECODE))
    assert code == 0 and doc["coverage"]["ok"], text


# --- item 5: serving entries the reference refuses, before anything runs -------------------------------

def test_a_serving_entry_the_reference_refuses_is_skipped_by_run_and_unusable_in_verify(fixture_copy, tmp_path,
                                                                                          capsys):
    """Before: run recorded the reference's own refusal (a commit snapshot at offset 0) and verify blamed the
    correct reference, exit 1; now run skips the case (exit 2, nothing written) and verify says why, exit 2."""
    def at_offset_0(doc):
        commit = next(s for s in _entry(doc, "spec-prefix-cache")["program"] if s["op"] == "commit")
        commit["snap_offset"] = [0, 4, 5]

    _edit_manifest(fixture_copy, at_offset_0)
    out = tmp_path / "ref"
    code = main(["run", "reference", "--fixtures", str(fixture_copy), "--out", str(out), "--profile", "f32",
                 "--case", "spec-prefix-cache", "-q"])
    cap = capsys.readouterr()
    assert code == 2 and not list(out.glob("spec-prefix-cache*")), cap.out + cap.err
    code, text, _, doc = _verify(capsys, out, "--fixtures", fixture_copy, "--case", "spec-prefix-cache")
    assert code == 2 and doc["cases"][0]["status"] == "error", text
    assert "step 3 (commit): snapshot 0 (sequence 7, offset 0) is no prefix of 1 or more tokens" in \
        doc["cases"][0]["problem"]


# --- item 6: a 5000-digit step; fixtures check and verify agree on a bad entry; counts ----------------

@pytest.mark.parametrize("key", ["error_step", "not_applicable_step"])
def test_a_5000_digit_step_is_unusable_outputs_not_a_gdncheck_bug(tmp_path, capsys, key):
    out = tmp_path / "o"
    out.mkdir()
    meta = {key: "7" * 5000, **({"error_code": "input_error"} if key == "error_step" else {"not_applicable": "n/a"})}
    perfect_outputs("fixtures/default", PREFILL, out, meta=meta)
    code, text, _, doc = _verify(capsys, out, "--case", PREFILL)
    (case,) = doc["cases"]
    assert code == 2 and case["status"] == "error", text
    assert case["problem"].startswith(f"outputs unusable: expected metadata {key} a step index 0..1 of the case's "
                                      "program, found a string of 5000 characters")
    assert "gdncheck bug" not in text


def test_fixtures_check_reports_every_bad_entry_and_checks_the_rest(fixture_copy, capsys):
    """Before: one bad entry refused the whole suite (one line, no case checked) while verify judged the
    others; now each bad entry is one line, every other case is checked, exit 2."""
    def edit(doc):
        keep = [PREFILL, DECODE, "error-head-ratio", "snapshot-replay"]
        doc["cases"] = [c for c in doc["cases"] if any(c["id"].startswith(k) for k in keep)]
        _entry(doc, DECODE)["program"][1]["expected"] = []
        _entry(doc, "error-head-ratio")["expected_error"]["accept"].append("input_dtype")

    doc = _edit_manifest(fixture_copy, edit)
    code = main(["fixtures", "check", "--fixtures", str(fixture_copy), "-q"])
    out = capsys.readouterr().out.splitlines()
    assert code == 2, out
    unusable = sorted(ln.split()[1].rstrip(":") for ln in out if ln.startswith("unusable"))
    assert unusable == sorted([_entry(doc, DECODE)["id"], _entry(doc, "error-head-ratio")["id"]])
    assert out[-1].startswith("2/2 cases reproduce; 2 manifest entries unusable (not checked; verify reports "
                              "the same entries)"), out


def test_a_selection_counts_every_entry(fixture_copy, tmp_path, capsys):
    """Before: "selects no case of the 0 in the manifest" for a suite whose 71 entries were all broken."""
    edited = _edit_manifest(fixture_copy, lambda d: [c.update(kind="bogus") for c in d["cases"]])
    n = len(edited["cases"])
    out = tmp_path / "o"
    out.mkdir()
    code, _, err, _ = _verify(capsys, out, "--fixtures", fixture_copy, "--tag", "decode")
    assert code == 2 and f"selects no case of the manifest's 0 usable of the {n} entries" in err, err
    code, text, _, doc = _verify(capsys, out, "--fixtures", fixture_copy)  # no selection: each entry reported
    assert code == 2 and doc["totals"]["errors"] == n and text.count("ERROR ") == n
