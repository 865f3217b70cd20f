"""gdncheck gate --merge: the shards of a matrix as one verdict, one gate-summary.json, one verify
summary per profile, one JUnit file and one report with a styled index; sets that are not one
matrix are refused."""

from __future__ import annotations

import json

import junitparser
import pytest

from gdncheck.cli import main
from gdncheck.gate import GateOptions, run_gate, validate_gate_summary
from gdncheck.gate.merge import MergeError, merge_gates

CASES = ["prefill_T1_", "decode_T12", "snapshot-replay", "error-head-ratio"]
MUTANT = "gdncheck.conformance.meta.mutants:norm_weight_plain"  # every case with a layer call fails at input_norm


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    base = tmp_path_factory.mktemp("shards")
    out = []
    for i in range(2):
        res = run_gate(GateOptions(impl=MUTANT, profiles=("f32",), cases=CASES, shard=(i, 2), out=str(base / f"s{i}"),
                                   property_names=["beta_zero"], max_examples=2, rebuild_check=False, jobs=1))
        assert res.exit_code == 1, res.doc.get("reason")
        out.append((base / f"s{i}", res.doc))
    return out


@pytest.mark.slow
def test_merge_is_one_result(shards, tmp_path, capsys):
    (s0, d0), (s1, d1) = shards
    ids0 = {f["case"] for f in d0["profiles"]["f32"]["failures"]}
    ids1 = {f["case"] for f in d1["profiles"]["f32"]["failures"]}
    assert ids0 and ids1 and not ids0 & ids1  # the shards really split the failing cases
    code = main(["gate", "--merge", str(s1), str(s0), "--out", str(tmp_path / "m"), "--report", str(tmp_path / "r"),
                 "--junit", str(tmp_path / "j.xml"), "--json"])
    assert code == 1
    doc = json.loads(capsys.readouterr().out)
    validate_gate_summary(doc)
    assert doc == json.loads((tmp_path / "m" / "gate-summary.json").read_text())
    assert doc["verdict"] == "does not conform" and [m["shard"] for m in doc["merged"]] == ["0/2", "1/2"]
    f32 = doc["profiles"]["f32"]
    assert {f["case"] for f in f32["failures"]} == ids0 | ids1
    assert f32["totals"]["cases"] == d0["profiles"]["f32"]["totals"]["cases"] + d1["profiles"]["f32"]["totals"]["cases"]
    assert all(f["first_divergence"]["stage"] == "input_norm" for f in f32["failures"])
    assert doc["selection"]["run"] == d0["selection"]["run"] + d1["selection"]["run"] == len(CASES)
    assert [(r["name"], r["profile"]) for r in doc["properties"]["results"]] == [("beta_zero_decays_only", "f32")]
    # one verify summary holding every shard's cases, each once
    merged = json.loads((tmp_path / "m" / "f32" / "verify-summary-f32.json").read_text())
    parts = [json.loads((s / "f32" / "verify-summary-f32.json").read_text())["cases"] for s in (s0, s1)]
    assert sorted(c["id"] for c in merged["cases"]) == sorted(c["id"] for part in parts for c in part)
    assert len({c["id"] for c in merged["cases"]}) == len(merged["cases"]) == len(CASES)
    # one JUnit file: every case of both shards
    xml = junitparser.JUnitXml.fromfile(str(tmp_path / "j.xml"))
    classes = {case.classname for suite in xml for case in suite}
    assert {f"conformance.f32.{c}" for c in ids0 | ids1} <= classes
    # the index: a styled page with the verdict grid, a link to the profile's report
    index = (tmp_path / "r" / "index.html").read_text()
    assert "<style>" in index and '<table class="grid">' in index and "<pre>" in index.split("<details>")[1]
    row = index.split("<tbody>")[1].split("</tbody>")[0]
    assert row.startswith('<tr><td><a href="f32/index.html">f32</a></td>') and 'class="verdict fail"' in row
    assert (tmp_path / "r" / "f32" / "index.html").is_file()


@pytest.mark.slow
def test_merge_refuses_what_is_not_one_matrix(shards, tmp_path):
    (s0, _), (s1, _) = shards
    with pytest.raises(MergeError, match="missing 1/2"):
        merge_gates([s0], tmp_path / "a")
    with pytest.raises(MergeError, match="given twice"):
        merge_gates([s0, s0, s1], tmp_path / "b")
    with pytest.raises(MergeError, match="expected a gate summary"):
        merge_gates([s0, tmp_path / "nowhere"], tmp_path / "c")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _relabelled(src, dst, **changes):
    """A copy of a shard's gate folder whose gate-summary.json says otherwise (``shard``, ``cases``...)."""
    import shutil

    shutil.copytree(src, dst)
    doc = json.loads((dst / "gate-summary.json").read_text())
    doc["selection"].update(changes)
    (dst / "gate-summary.json").write_text(json.dumps(doc))
    return dst


@pytest.mark.slow
def test_merge_refuses_a_relabelled_copy_and_another_plan(shards, tmp_path, capsys):
    """Issue 37: a copy of shard 0 labelled 1/2 merged with shard 0 to one verdict, every case id twice
    and shard 1 never run. The shards' cases must be disjoint and the ones their labels select."""
    (s0, _), (s1, _) = shards
    copy = _relabelled(s0, tmp_path / "copy", shard=[1, 2])
    code = main(["gate", "--merge", str(s0), str(copy), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "expected disjoint shards; case " in err and "a copy of one shard under another label?" in err
    assert not (tmp_path / "m").exists()
    other = _relabelled(s1, tmp_path / "other", cases=["decode_T12"])
    with pytest.raises(MergeError, match=r"selection \(--case, --tag\)"):
        merge_gates([s0, other], tmp_path / "m2")
    # shard 1's summary with one of its cases taken out: not what 1/2 of this suite selects
    short = _relabelled(s1, tmp_path / "short")
    path = short / "f32" / "verify-summary-f32.json"
    v = json.loads(path.read_text())
    v["cases"] = v["cases"][1:]
    path.write_text(json.dumps(v))
    with pytest.raises(MergeError, match=r"shard 1/2 of this suite selects 2 case\(s\), its summary holds 1"):
        merge_gates([s0, short], tmp_path / "m3")
