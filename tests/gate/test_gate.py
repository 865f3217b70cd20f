"""gdncheck gate end to end on small selections: a correct implementation conforms, a mutant does
not (first divergence at its stage, a property failure that replays from its blob), drifted
fixtures and unknown implementations are refused (exit 2), the interpreter skip is listed, JUnit
reads as CI publishers read it, and every gate-summary.json written here meets its JSON schema."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import junitparser
import pytest

from gdncheck.cli import main
from gdncheck.conformance.properties.registry import subject_from_env
from gdncheck.conformance.properties.runner import run_property
from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.gate import GateOptions, validate_gate_summary
from gdncheck.gate import run_gate as _run_gate

CASES = ["prefill_T1_", "decode_T12", "snapshot-replay", "error-head-ratio"]


def run_gate(opts: GateOptions):
    """run_gate, then the summary it returned and the one it wrote are checked against the schema."""
    res = _run_gate(opts)
    validate_gate_summary(res.doc)
    validate_gate_summary(json.loads((Path(opts.out) / "gate-summary.json").read_text()))
    return res


def junit_cases(path) -> list:
    xml = junitparser.JUnitXml.fromfile(str(path))
    return [(suite.name, case) for suite in xml for case in suite]


@pytest.mark.slow
def test_reference_conforms(tmp_path):
    res = run_gate(GateOptions(impl="reference", profiles=("bf16",), cases=CASES, out=str(tmp_path / "out"),
                               junit=str(tmp_path / "junit.xml"), report=str(tmp_path / "report"),
                               property_names=["differential", "orthonormal"], max_examples=3))
    assert res.exit_code == 0, res.doc.get("reason") or json.dumps(res.doc["profiles"], indent=1)[:3000]
    doc = json.loads((tmp_path / "out" / "gate-summary.json").read_text())
    assert doc["schema"] == "gdncheck-gate-summary" and doc["verdict"] == "conforms"
    assert doc["fixtures"]["checksums"] == "ok" and doc["fixtures"]["rebuild"].startswith("identical")
    assert doc["profiles"]["bf16"]["totals"]["cases"] == 4 and doc["profiles"]["bf16"]["failures"] == []
    assert {r["name"] for r in doc["properties"]["results"]} == {"differential", "orthonormal_recall"}
    assert (tmp_path / "out" / "bf16" / "verify-summary-bf16.json").is_file()
    assert (tmp_path / "report" / "summary.txt").read_text().startswith("gdncheck gate: conforms (exit 0)")
    assert (tmp_path / "report" / "bf16" / "index.html").is_file()
    assert 'href="bf16/index.html"' in (tmp_path / "report" / "index.html").read_text()
    cases = junit_cases(tmp_path / "junit.xml")
    names = {(s, c.classname, c.name) for s, c in cases}
    assert ("conformance.bf16", "conformance.bf16.decode_T12_Hk2_Hv4_dk16_dv16_s0", "delta_rule") in names
    assert ("conformance.bf16", "conformance.bf16.error-head-ratio_T0_Hk1_Hv2_dk4_dv4_s0", "expected_error") in names
    assert ("properties.bf16", "properties.bf16.differential", "differential") in names
    assert ("fixtures", "fixtures", "checksums") in names
    assert all(c.is_passed or c.is_skipped for _, c in cases)


@pytest.mark.slow
def test_mutant_does_not_conform_and_its_property_failure_replays(tmp_path):
    mutant = "gdncheck.conformance.meta.mutants:decay_after_write"
    res = run_gate(GateOptions(impl=mutant, profiles=("f32",), cases=["prefill-decode_T65", "decode_T12"],
                               out=str(tmp_path / "out"), property_names=["differential"], max_examples=5))
    assert res.exit_code == 1
    fails = res.doc["profiles"]["f32"]["failures"]
    assert {f["first_divergence"]["stage"] for f in fails} == {"delta_rule"}
    assert all("but should be" in f["message"] and "gdncheck verify" in f["repro"] for f in fails)
    prop = res.doc["properties"]["results"][0]
    assert prop["status"] == "fail" and prop["blob"] and f"--replay {prop['blob']}" in prop["replay"]
    assert any("Draw 1 (config)" in n for n in prop["notes"])
    failures = [c for s, c in junit_cases(tmp_path / "out" / "gate-junit.xml") if not c.is_passed and not c.is_skipped]
    assert any(c.name == "delta_rule" and "but should be" in c.result[0].text for c in failures)
    assert any(c.name == "differential" and "replay:" in c.result[0].text for c in failures)
    again = run_property("differential", subject_from_env(mutant, "f32"), hypothesis_profile="ci",
                         replay=prop["blob"])
    assert again.status == "fail" and again.examples == 1


def test_drifted_fixtures_are_refused(tmp_path, capsys):
    copy = tmp_path / "fixtures"
    shutil.copytree(DEFAULT_DIR, copy)
    victim = next(copy.glob("decode_T12_*.safetensors"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    code = main(["gate", "--impl", "reference", "--fixtures", str(copy), "--out", str(tmp_path / "out"), "-q",
                 "--junit", str(tmp_path / "j.xml")])
    out = capsys.readouterr().out
    assert code == 2
    assert "fixtures drifted" in out and "decode_T12_Hk2_Hv4_dk16_dv16_s0" in out and "sha256" in out
    cases = junit_cases(tmp_path / "j.xml")
    assert [c.name for _, c in cases] == ["setup"] and "fixtures drifted" in cases[0][1].result[0].message
    doc = json.loads((tmp_path / "out" / "gate-summary.json").read_text())
    validate_gate_summary(doc)
    assert doc["verdict"] == "could not run" and "fixtures drifted" in doc["reason"] and "profiles" not in doc


def test_unknown_implementation_cannot_run(tmp_path):
    res = run_gate(GateOptions(impl="no_such_module:factory", profiles=("f32",), out=str(tmp_path)))
    assert res.exit_code == 2 and "cannot import module 'no_such_module'" in res.reason


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu"])
def test_interpreter_skip_is_listed(tmp_path, device):
    res = run_gate(GateOptions(impl="triton", device=device, profiles=("f32",), cases=["prefill_T1_", "long-decode"],
                               out=str(tmp_path), properties=False))
    assert res.exit_code == 0, res.doc
    skipped = res.doc["selection"]["skipped"]
    # the 2048-token decode and the depth suite's two 1001-call decodes (d128-long-decode, 193 calls, runs)
    assert [s["case"] for s in skipped] == ["long-decode_T2548_Hk1_Hv2_dk8_dv8_s0",
                                            "long-decode-gva2_T1008_Hk2_Hv4_dk16_dv16_s0",
                                            "long-decode-mha_T1100_Hk2_Hv2_dk16_dv16_s0"]
    assert all("interpreter" in s["reason"] and "--all-cases" in s["reason"] for s in skipped)
    junit = {(c.classname, c.name): c for _, c in junit_cases(tmp_path / "gate-junit.xml")}
    skip = junit[("conformance.f32.long-decode_T2548_Hk1_Hv2_dk8_dv8_s0", "case")]
    assert skip.is_skipped and "interpreter" in skip.result[0].message
    assert junit[("conformance.f32.prefill_T1_Hk1_Hv1_dk16_dv16_s0", "delta_rule")].is_passed


def test_verify_writes_junit_for_a_port(tmp_path):
    """A port's CI: outputs written by any runner (here a mutant), then verify --junit."""
    out = tmp_path / "out"
    assert main(["run", "gdncheck.conformance.meta.mutants:norm_weight_plain", "--profile", "bf16", "--out", str(out),
                 "--case", "decode_T12", "--case", "error-invalid-eps"]) == 0
    code = main(["verify", "--outputs", str(out), "--profile", "bf16", "--case", "decode_T12", "--case",
                 "error-invalid-eps", "--junit", str(tmp_path / "v.xml")])
    assert code == 1
    cases = {(c.classname, c.name): c for _, c in junit_cases(tmp_path / "v.xml")}
    first = cases[("conformance.bf16.decode_T12_Hk2_Hv4_dk16_dv16_s0", "input_norm")]
    assert not first.is_passed and "x_norm" in first.result[0].text and "repro:" in first.result[0].text
    assert cases[("conformance.bf16.error-invalid-eps_T0_Hk1_Hv2_dk4_dv4_s0", "expected_error")].is_passed


@pytest.mark.slow
def test_the_schema_rejects_inconsistent_summaries(tmp_path):
    """The schema is not a formality: a verdict that contradicts the exit code, a missing section and
    a property failure without its replay line are each refused."""
    import jsonschema

    res = run_gate(GateOptions(impl="reference", profiles=("f32",), cases=["prefill_T1_"], out=str(tmp_path),
                               property_names=["orthonormal"], max_examples=1))
    assert res.exit_code == 0
    broken = []
    doc = copy.deepcopy(res.doc)
    doc["verdict"] = "does not conform"
    broken.append(doc)
    doc = copy.deepcopy(res.doc)
    del doc["profiles"]
    broken.append(doc)
    doc = copy.deepcopy(res.doc)
    doc["properties"]["results"][0].update(status="fail", replay=None)
    broken.append(doc)
    doc = copy.deepcopy(res.doc)
    doc["fixtures"]["manifest_sha256"] = "not a digest"
    broken.append(doc)
    for doc in broken:
        with pytest.raises(jsonschema.ValidationError):
            validate_gate_summary(doc)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_suite_drifted_from_its_generator_fails_with_the_rebuild_beside_the_work(tmp_path, jobs):
    """The rebuild runs in the workers, first, beside the cases: a case file whose checksum matches its
    manifest but not what its recipe builds still stops the gate (exit 2, naming the case), with the
    summary a drifted suite leaves (no fixtures section, no profiles), whatever the number of workers."""
    suite = tmp_path / "fixtures"
    shutil.copytree(DEFAULT_DIR, suite)
    doc = json.loads((suite / "manifest.json").read_text())
    entry = next(e for e in doc["cases"] if e["id"].startswith("decode_T12_"))
    path = suite / entry["file"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # a golden value changed ...
    path.write_bytes(bytes(data))
    entry["sha256"] = hashlib.sha256(bytes(data)).hexdigest()  # ... and its checksum made to match
    (suite / "manifest.json").write_text(json.dumps(doc, indent=1))
    res = run_gate(GateOptions(impl="reference", profiles=("f32",), fixtures=str(suite), rebuild_check=True,
                               cases=["prefill_T1_", "decode_T12"], out=str(tmp_path / "out"), properties=False,
                               jobs=jobs))
    assert res.exit_code == 2 and res.verdict == "could not run"
    assert res.reason.startswith("fixtures drifted from their generator") and entry["id"] in res.reason
    assert "changed" in res.reason
    written = json.loads((tmp_path / "out" / "gate-summary.json").read_text())
    assert written["exit_code"] == 2 and "fixtures" not in written and "profiles" not in written


def test_the_rebuild_is_split_over_the_workers_by_its_cost():
    from gdncheck.fixtures.manifest import load_manifest
    from gdncheck.gate.plan import call_count
    from gdncheck.gate.run import split_rebuild

    manifest = load_manifest(DEFAULT_DIR)
    ids = [e["id"] for e in manifest["cases"]]
    cost = {e["id"]: 1 + call_count(e) for e in manifest["cases"]}
    for parts in (1, 2, 3):
        groups = split_rebuild(manifest, parts)
        assert len(groups) == parts and sorted(i for g in groups for i in g) == sorted(ids)  # each case once
        assert all(g == [i for i in ids if i in set(g)] for g in groups)  # in manifest order
        loads = [sum(cost[i] for i in g) for g in groups]
        assert max(loads) - min(loads) <= max(cost.values())  # greedy: within the largest case of even
