"""Known failures for ports (conformance/judge/xfails.py): one file format for `gdncheck verify
--xfails`, the gate and the pytest plugin. A known failure does not make verify's exit 1 when the
case fails only in the listed tensors or stages; an entry whose case passes is stale (a warning); a
malformed file is exit 2 and one line."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from gdncheck.cli import main
from gdncheck.conformance.judge.records import validate_summary
from gdncheck.conformance.judge.xfails import classify, load_xfails
from gdncheck.errors import GDNError
from gdncheck.gate.xfails import load_xfails as gate_load_xfails
from tests.fixtures.outputs import perfect_outputs

# the gated RMSNorm weight as 1 + w: fails core_gated and everything after it, nothing before
MUTANT = "gdncheck.conformance.meta.mutants:gated_norm_weight_one_plus"
LATE = "gated_norm,out_proj,residual,post_norm,mlp,output"  # the stages it fails in
FAILING = ["attn_out", "core_gated", "h", "h_norm", "mlp_out", "out"]
DECODE, PREFILL, REFUSED = "decode_T12", "prefill_T1_", "error-input-dtype"  # the mutant passes the last one


@pytest.fixture(scope="module")
def outs(tmp_path_factory):
    root = tmp_path_factory.mktemp("xfails")
    for impl, name in ((MUTANT, "mutant"), ("reference", "ref")):
        assert main(["run", impl, "--profile", "f32", "--out", str(root / name), "--case", DECODE,
                     "--case", PREFILL, "--case", REFUSED, "-q"]) == 0
    # the mutant's decode and error cases beside a case that computes and passes (a golden copy's): a run
    # passes only if a case that judged tensors passed (issue 43), so a known failure needs one beside it
    (root / "mixed").mkdir()
    for f in (root / "mutant").glob("*.safetensors"):
        if not f.name.startswith(PREFILL):
            shutil.copy(f, root / "mixed" / f.name)
    perfect_outputs("fixtures/default", PREFILL, root / "mixed")
    return root


def _verify(outs, capsys, folder, entries: str, *cases: str):
    xf = outs / f"xfails-{folder}.txt"
    xf.write_text(entries)
    summary = outs / f"summary-{folder}.json"
    code = main(["verify", "--outputs", str(outs / folder), "--profile", "f32", "--diagnose", "0",
                 "--summary", str(summary), "--xfails", str(xf), *[a for c in cases for a in ("--case", c)]])
    cap = capsys.readouterr()
    doc = json.loads(summary.read_text())
    validate_summary(doc)
    return code, cap.out + cap.err, doc


def test_a_known_failure_by_stage_does_not_fail_the_run(outs, capsys):
    code, text, doc = _verify(outs, capsys, "mixed", f"# known\n{MUTANT}  f32  {DECODE}  {LATE}  # issue 7\n",
                              DECODE, PREFILL, REFUSED)
    assert code == 0 and doc["exit_code"] == 0 and doc["verdict"] == "conforms"
    (k,) = doc["xfails"]["known_failures"]
    assert k == {"case": doc["cases"][0]["id"], "tensors": FAILING, "reason": "issue 7", "line": 2}
    assert doc["cases"][0]["status"] == "fail"  # the verdict on the case itself is kept
    assert f"xfail {doc['cases'][0]['id']}: known failure (" in text and ":2: issue 7)" in text
    assert "FAIL  " not in text and "0 fail, 1 known failure(s)" in text


def test_known_failures_alone_are_no_pass(outs, capsys):
    """Issue 37: a run whose every judged case is a known failure showed nothing conforms: exit 1, and
    the summary's coverage says why (never ``coverage.ok`` false beside exit 0)."""
    code, text, doc = _verify(outs, capsys, "mutant", f"* f32 {DECODE} *  # issue 7\n* f32 {PREFILL} *  # issue 7\n",
                              DECODE, PREFILL)
    assert code == 1 and doc["verdict"] == "does not conform" and len(doc["xfails"]["known_failures"]) == 2
    assert doc["coverage"]["ok"] is False and "no case passed" in doc["coverage"]["problems"][0]
    assert "0 fail, 2 known failure(s)" in text and "FAIL  " not in text


def test_tensor_names_and_another_implementation(outs, capsys):
    code, _, doc = _verify(outs, capsys, "mixed", f"* * {DECODE} {','.join(FAILING)}  # tensors\n", DECODE,
                           PREFILL, REFUSED)
    assert code == 0 and len(doc["xfails"]["known_failures"]) == 1
    code, _, doc = _verify(outs, capsys, "mutant", f"otherport:factory * {DECODE} *  # not this one\n", DECODE)
    assert code == 1 and not doc["xfails"]["known_failures"]  # the entry names another implementation


def test_failing_beyond_the_entry_still_fails(outs, capsys):
    code, text, doc = _verify(outs, capsys, "mutant", f"* f32 {DECODE} gated_norm  # only the norm\n",
                              DECODE, PREFILL)
    assert code == 1 and doc["verdict"] == "does not conform"
    assert not doc["xfails"]["known_failures"] and not doc["xfails"]["stale"]  # failing is not stale
    assert text.count("FAIL  ") == 2
    code, _, doc = _verify(outs, capsys, "mutant", f"* bf16 {DECODE} *  # another profile\n", DECODE)
    assert code == 1 and not doc["xfails"]["known_failures"]


def test_a_stale_entry_is_reported(outs, capsys):
    code, text, doc = _verify(outs, capsys, "ref", f"* f32 {PREFILL} {LATE}  # fixed since?\n", DECODE, PREFILL)
    assert code == 0  # stale warns, as the gate does: exit 1 only ever means "does not conform"
    (s,) = doc["xfails"]["stale"]
    assert s["case"] == PREFILL and s["line"] == 1 and s["reason"] == "fixed since?"
    assert any(n.startswith("stale known failure (") and "delete the entry" in n for n in doc["notes"])
    assert "note: stale known failure" in text and "1 stale known-failure entry(ies)" in text


@pytest.mark.parametrize("body, why", [
    ("* f32 decode out\n", "needs its reason after '#'"),
    ("* f32 decode  # three fields\n", "expected 'IMPL PROFILE CASE WHAT  # reason'"),
    ("* fp32 decode out  # r\n", "expected PROFILE '*' or one of f32"),
    ("* f32 decode outt,core  # r\n", "expected WHAT '*' or tensor and stage names"),
])
def test_a_bad_file_is_exit_2_and_one_line(outs, capsys, body, why):
    xf = outs / "bad.txt"
    xf.write_text("# header\n" + body)
    summary = outs / "ref" / "verify-summary-f32.json"
    summary.write_text("{}")  # a stale summary: the file is refused before anything is touched
    code = main(["verify", "--outputs", str(outs / "ref"), "--profile", "f32", "--xfails", str(xf)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert why in err and "bad.txt:2:" in err and "Traceback" not in err
    assert summary.read_text() == "{}"


def test_a_missing_file_is_exit_2(outs, capsys):
    code = main(["verify", "--outputs", str(outs / "ref"), "--profile", "f32", "--xfails", str(outs / "nope.txt")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot read the known-failures file" in err


def _rec(tensor, stage, op="decode"):
    return SimpleNamespace(tensor=tensor, stage=stage, op=op, verdict="fail")


def test_classify_stages_state_and_snapshot(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("* * a delta_rule  # a stage\n* * b state,snapshot  # seq_len, saved files\n* * c *  # raised\n")
    xs = load_xfails(f)
    reports = [SimpleNamespace(id="a_s0", status="fail", records=[_rec("core", "delta_rule"),
                                                                  _rec("recurrent_state", "delta_rule")]),
               SimpleNamespace(id="b_s0", status="fail", records=[_rec("seq_len", "state"),
                                                                  _rec("conv_state", "conv1d", op="save")]),
               SimpleNamespace(id="c_s0", status="fail", records=[])]  # raised: no failing tensor
    covered, stale = classify(xs, "anything", "f32", reports)
    assert {c: x.line for c, x in covered.items()} == {"a_s0": 1, "b_s0": 2, "c_s0": 3} and not stale
    reports[0].records.append(_rec("core_gated", "gated_norm"))
    covered, _ = classify(xs, "anything", "f32", reports)
    assert "a_s0" not in covered
    # the gate reads the same format through its own default (gate/xfails.py)
    assert [x.to_json() for x in gate_load_xfails(f)] == [x.to_json() for x in xs]
    with pytest.raises(GDNError, match="x.txt:1"):
        f.write_text("* * a nosuchstage  # r\n")
        gate_load_xfails(f)
