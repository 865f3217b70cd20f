"""No vacuous verdict (issue 11, item 2): a run that judged nothing, a case every port must run declared
not applicable, a case that judged no tensor, or a selection of no case never exits 0; the coverage
shows in the manifest, the console, the summary JSON and the JUnit file."""

from __future__ import annotations

import json

import junitparser
import pytest

from gdncheck.cli import main
from gdncheck.conformance.judge.records import validate_summary
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.manifest import SCHEMA_PATH
from gdncheck.gate import GateOptions, run_gate, validate_gate_summary
from tests.apps.plugins import never_applicable
from tests.fixtures.outputs import perfect_outputs

NEVER = "tests.apps.plugins:never_applicable"


def test_every_case_of_the_manifest_states_its_coverage(fixtures_dir, manifest):
    """The field a port in any language reads: features it may lack, the tensors every call requires."""
    import jsonschema

    from gdncheck.fixtures.coverage import FEATURES, derive_coverage

    raw = json.loads((fixtures_dir / "manifest.json").read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(raw)
    by_recipe = {c["id"].split("_")[0]: c["coverage"] for c in raw["cases"]}
    assert all(c["coverage"] == derive_coverage(c) for c in raw["cases"])
    assert by_recipe["prefill"] == {"features": [], "required": ["out", "conv_state", "recurrent_state"]}
    assert by_recipe["per-head-norm"]["features"] == ["per_head_norm"]
    assert by_recipe["snapshot-replay"]["features"] == ["snapshot_files"]
    assert by_recipe["batch-positions"]["features"] == ["seq_len_reset"]
    assert by_recipe["error-seq-pos-mismatch"]["features"] == ["seq_len_reset", "strict_mode"]
    assert by_recipe["error-head-ratio"] == {"features": ["config_checks"], "required": []}
    assert by_recipe["error-input-dtype"] == {"features": [], "required": []}  # a port must refuse it
    # the serving patterns, read off the program's steps (a port without them may skip these cases)
    assert by_recipe["packed-mixed"]["features"] == ["packed_calls"]
    assert by_recipe["packed-mismatch"]["features"] == ["seq_len_reset", "packed_calls"]  # a slot at another position
    assert by_recipe["spec-decode"]["features"] == ["seq_len_reset", "packed_calls", "spec_decode"]
    assert by_recipe["dk-gt-dv"]["features"] == by_recipe["dk-lt-dv"]["features"] == ["dk_ne_dv"]
    assert by_recipe["prefix-cache"]["features"] == ["packed_calls", "prefix_snapshots"]
    assert {f for c in raw["cases"] for f in c["coverage"]["features"]} == set(FEATURES)


def test_a_port_that_declares_everything_not_applicable_does_not_conform(fixtures_dir, tmp_path):
    cases = ["prefill_T1_", "snapshot-replay", "error-input-dtype"]
    rep = run_impl(never_applicable, fixtures_dir, tmp_path, "f32", cases=cases)
    assert {c.status for c in rep.cases} == {"not_applicable"}
    s = verify(fixtures_dir, tmp_path, "f32", cases=cases)
    doc = s.to_json()
    validate_summary(doc)
    status = {c.id.split("_")[0]: c.status for c in s.cases}
    assert status == {"prefill": "fail", "snapshot-replay": "not_applicable", "error-input-dtype": "fail"}
    prefill = next(c for c in s.cases if c.id.startswith("prefill"))
    assert prefill.first_divergence.reason == "not_applicable" and "every conforming port" in prefill.message
    assert s.exit_code == 1 and doc["verdict"] == "does not conform"
    cov = doc["coverage"]
    assert (cov["judged"], cov["required"], cov["not_applicable"], cov["ok"]) == (2, 2, 1, False)
    assert cov["not_applicable_features"] == {"snapshot_files": 1}


def test_a_run_in_which_only_optional_cases_are_not_applicable_judged_nothing(fixtures_dir, tmp_path, capsys):
    # per-head-norm_T: the one case, not its depth variants (-gva2, -mha)
    run_impl(never_applicable, fixtures_dir, tmp_path, "f32", cases=["snapshot-replay", "per-head-norm_T"])
    code = main(["verify", "--outputs", str(tmp_path), "--profile", "f32", "--case", "snapshot-replay", "--case",
                 "per-head-norm_T", "--junit", str(tmp_path / "j.xml")])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "nothing judged" in out and "coverage: 0 of 2 case(s) judged" in out
    doc = json.loads((tmp_path / "verify-summary-f32.json").read_text())
    validate_summary(doc)
    assert doc["verdict"] == "nothing judged" and doc["coverage"]["ok"] is False
    junit = {c.name: c for s in junitparser.JUnitXml.fromfile(str(tmp_path / "j.xml")) for c in s}
    assert not junit["coverage"].is_passed and "nothing was judged" in junit["coverage"].result[0].message


def test_the_gate_never_conforms_on_nothing(tmp_path):
    res = run_gate(GateOptions(impl=NEVER, profiles=("f32",), cases=["prefill_T1_", "snapshot-replay"],
                               out=str(tmp_path / "out"), properties=False, jobs=1, rebuild_check=False))
    validate_gate_summary(res.doc)
    assert res.exit_code == 1, res.doc.get("reason")
    assert res.doc["profiles"]["f32"]["coverage"]["ok"] is False
    # every selected case skipped on the interpreter: nothing judged, never "conforms"
    res = run_gate(GateOptions(impl="triton", device="cpu", profiles=("f32",), cases=["long-decode"],
                               out=str(tmp_path / "out2"), properties=False, jobs=1, rebuild_check=False))
    validate_gate_summary(res.doc)
    assert res.exit_code == 2 and "nothing judged" in res.reason


def test_a_case_that_judged_no_tensor_is_no_pass(fixtures_dir, tmp_path):
    """Stage-isolated mode makes every output optional: an outputs file of none of them passes nothing."""
    perfect_outputs(fixtures_dir, "real-heads_T3_Hk16_Hv32", tmp_path, alter=lambda t: t.clear(),
                    meta={"mode": "stage_isolated"})
    s = verify(fixtures_dir, tmp_path, "f32", cases=["real-heads_T3_Hk16_Hv32"], stage_isolated=True)
    validate_summary(s.to_json())
    (case,) = s.cases
    assert case.status == "fail" and case.first_divergence.reason == "nothing_judged", case.message
    assert s.exit_code == 1 and not s.coverage()["ok"]


@pytest.mark.parametrize("selection", [["--tag", "no-such-tag"], ["--case", "prefill_T1_", "--shard", "3/4"],
                                       ["--case", "error-head", "--tag", "prefill"]])
def test_a_selection_of_no_case_is_a_usage_error(tmp_path, capsys, selection):
    for command in (["verify", "--outputs", str(tmp_path)], ["run", "reference", "--out", str(tmp_path / "o")]):
        code = main([*command, "--profile", "f32", *selection])
        err = capsys.readouterr().err
        assert code == 2 and "selects no case" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob("verify-summary-*"))


def test_the_console_counts_judged_tensors_as_the_coverage_does(fixtures_dir, tmp_path, capsys):
    """A tensor not provided is not judged: the verdict line and the coverage line give the same count."""
    import re

    perfect_outputs(fixtures_dir, "decode_T12", tmp_path, alter=lambda t: t.pop("calls.0.core"))
    code = main(["verify", "--outputs", str(tmp_path), "--profile", "f32", "--case", "decode_T12"])
    out = capsys.readouterr().out
    covered = int(re.search(r"coverage: .*, (\d+) tensor\(s\) judged", out).group(1))
    judged, missing = map(int, re.search(r"(\d+) tensors judged, \d+ failed, (\d+) not provided", out).groups())
    doc = json.loads((tmp_path / "verify-summary-f32.json").read_text())
    assert code == 0 and missing == 1 and judged == covered == doc["coverage"]["tensors_judged"]
    assert doc["totals"]["records"] == judged + missing


def test_dk_ne_dv_is_an_optional_feature_a_dk_eq_dv_port_conforms_without(fixtures_dir, tmp_path, manifest):
    """Every released Qwen3.5 / Qwen3-Next checkpoint has dk = dv and llama.cpp asserts it: the dk != dv
    cases carry the feature ``dk_ne_dv`` (read off the config here, independently), so a port that runs
    dk = dv only conforms; the cases are still judged for a port that runs them."""
    from tests.apps.plugins import dk_eq_dv_only

    unequal = sorted(c["id"] for c in manifest["cases"] if c["kind"] != "error"
                     and c["config"]["linear_key_head_dim"] != c["config"]["linear_value_head_dim"])
    assert len(unequal) >= 3  # dk-gt-dv, dk-lt-dv, and a sparse case with dk 16, dv 8
    assert all("dk_ne_dv" in c["coverage"]["features"] for c in manifest["cases"] if c["id"] in unequal)
    cases = [*unequal, "prefill_T1_", "decode_T12"]
    run_impl(dk_eq_dv_only, fixtures_dir, tmp_path, "f32", cases=cases)
    s = verify(fixtures_dir, tmp_path, "f32", cases=cases)
    status = {c.id: c.status for c in s.cases}
    assert {status[i] for i in unequal} == {"not_applicable"}, status
    assert s.exit_code == 0 and s.coverage()["not_applicable_features"]["dk_ne_dv"] == len(unequal)
    run_impl("reference", fixtures_dir, tmp_path / "all", "f32", cases=unequal)  # judged when run
    assert {c.status for c in verify(fixtures_dir, tmp_path / "all", "f32", cases=unequal).cases} == {"pass"}


CONFIG_ONLY = ["error-head-ratio", "error-invalid-eps"]  # answered by gdncheck's own parser for a plug-in


def test_cases_only_gdncheck_judged_are_nothing_judged(fixtures_dir, tmp_path, capsys):
    """A config-error case of a Python plug-in is answered by gdncheck's parser before the port is called
    (its outputs file says ``error_raised_by gdncheck``): a run of only such cases judged gdncheck, not
    the port, so it is 'nothing judged' (exit 2) in verify, and the gate does not conform."""
    from gdncheck.safetensors_io import SafetensorsFile

    run_impl(never_applicable, fixtures_dir, tmp_path, "f32", cases=CONFIG_ONLY)
    meta = SafetensorsFile(next(tmp_path.glob("error-head-ratio*.safetensors"))).metadata
    assert meta["error_raised_by"] == "gdncheck"
    code = main(["verify", "--outputs", str(tmp_path), "--profile", "f32",
                 *sum((["--case", c] for c in CONFIG_ONLY), [])])
    out = capsys.readouterr().out
    assert code == 2 and "nothing judged" in out and "gdncheck's own config parser" in out, out
    doc = json.loads((tmp_path / "verify-summary-f32.json").read_text())
    validate_summary(doc)
    assert doc["verdict"] == "nothing judged" and doc["coverage"]["gdncheck_checks"] == 2
    # one case that judged the port is enough: the rule counts what the port was judged on
    run_impl("reference", fixtures_dir, tmp_path, "f32", cases=["prefill_T1_"])
    assert verify(fixtures_dir, tmp_path, "f32", cases=[*CONFIG_ONLY, "prefill_T1_"]).exit_code == 0
    res = run_gate(GateOptions(impl=NEVER, profiles=("f32",), cases=CONFIG_ONLY, out=str(tmp_path / "gate"),
                               properties=False, jobs=1, rebuild_check=False))
    validate_gate_summary(res.doc)
    assert res.exit_code != 0 and res.doc["profiles"]["f32"]["coverage"]["ok"] is False


def test_a_port_that_raises_the_config_error_itself_is_judged(fixtures_dir, tmp_path):
    """A port writing its own outputs (any language) raises the config errors itself: no error_raised_by,
    so the case judges the port."""
    from tests.fixtures.outputs import perfect_outputs

    perfect_outputs(fixtures_dir, "error-head-ratio", tmp_path,
                    meta={"error_code": "head_ratio", "error_message": "Hv not a multiple of Hk", "error_step": "0"})
    s = verify(fixtures_dir, tmp_path, "f32", cases=["error-head-ratio"])
    assert [c.status for c in s.cases] == ["pass"] and len(s.port_judged()) == 1, [c.message for c in s.cases]
    # the port judged, but no tensor of it (issue 37: `verify --tag error` of a numerically broken port
    # "conformed"): nothing of its numbers was judged, exit 2
    assert s.exit_code == 2 and s.verdict() == "nothing judged"
    assert "no tensor was judged" in s.coverage()["problems"][0]


def test_stage_isolated_skips_the_serving_cases_so_the_reference_conforms(fixtures_dir, tmp_path):
    """FORMAT.md §8: packed calls are judged end to end only. Before, verify failed the serving cases
    stage-isolated as 'nothing judged', so not even gdncheck's own reference could conform there."""
    cases = ["packed-mixed", "spec-decode", "decode_T12"]
    run_impl("reference", fixtures_dir, tmp_path, "f32", cases=cases, stage_isolated=True)
    s = verify(fixtures_dir, tmp_path, "f32", cases=cases, stage_isolated=True)
    assert [c.id.split("_")[0] for c in s.cases] == ["decode"] and s.exit_code == 0
    assert any("2 serving case(s) not applicable" in n for n in s.notes), s.notes
