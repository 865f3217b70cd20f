"""Containment (issue 11, item 3): no name read from a fixture folder, an outputs folder, a name table
or a summary makes a command read or write outside the folder it belongs to (absolute paths, '..',
links out, devices); a non-default suite can be pinned by its manifest's checksum."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from gdncheck.cli import main
from gdncheck.fixtures.build import check_suite
from gdncheck.fixtures.manifest import load_manifest, sha256_file
from gdncheck.gate import GateOptions, run_gate
from tests.fixtures.outputs import perfect_outputs
from tests.helpers import default_case_id

SNAP = default_case_id("snapshot-replay")
DECODE = default_case_id("decode")


def _tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _rename_snapshot_files(fixture_copy, name: str) -> None:
    path = fixture_copy / "manifest.json"
    doc = json.loads(path.read_text())
    for c in doc["cases"]:
        for s in c["program"]:
            if s["op"] in ("save", "load"):
                s["file"] = name
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("name", ["../../escaped/snap.safetensors", "ABSOLUTE"])
def test_run_and_gate_write_no_snapshot_file_outside_their_folder(fixture_copy, tmp_path, name, capsys):
    # an absolute name of a place of this test's own (a fixed /tmp name would see other runs' files)
    absolute = tmp_path / "absolute" / "snap.safetensors"
    _rename_snapshot_files(fixture_copy, str(absolute) if name == "ABSOLUTE" else name)
    before = _tree(tmp_path)
    out = tmp_path / "work" / "out"
    code = main(["run", "reference", "--fixtures", str(fixture_copy), "--out", str(out), "--profile", "f32",
                 "--case", "snapshot-replay", "--case", "prefill_T1_"])
    text = capsys.readouterr().out
    assert code == 2 and f"skipped  {SNAP}" in text and "outside its folder" in text
    assert (out / "prefill_T1_Hk1_Hv1_dk16_dv16_s0.safetensors").is_file()  # the other case ran
    assert not absolute.parent.exists()
    assert _tree(tmp_path) - before <= {"work", "work/out", *(f"work/out/{p.name}" for p in out.iterdir())}
    res = run_gate(GateOptions(impl="reference", profiles=("f32",), fixtures=str(fixture_copy), cases=["snapshot"],
                               out=str(tmp_path / "work" / "gate"), properties=False, jobs=1))
    assert res.exit_code == 2 and "outside its folder" in (res.reason or "")
    assert not (tmp_path / "escaped").exists() and not absolute.parent.exists()


def test_verify_reads_no_outputs_file_outside_its_folder(fixtures_dir, tmp_path):
    """A link to a file elsewhere, a link to a device and a folder in place of a file: each unusable."""
    from gdncheck.conformance.judge.verify import verify

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    good = perfect_outputs(fixtures_dir, "decode_T12", elsewhere)
    (out / good.name).symlink_to(good)
    (out / "prefill_T1_Hk1_Hv1_dk16_dv16_s0.safetensors").symlink_to("/dev/zero")
    (out / f"{default_case_id('batch-positions')}.safetensors").mkdir()
    perfect_outputs(fixtures_dir, "prefill-decode_T65", out)
    s = verify(fixtures_dir, out, "f32", cases=["decode_T12", "prefill_T1_", "batch-positions", "prefill-decode_T65"])
    problems = {c.id.split("_")[0]: c.problem for c in s.cases}
    assert "points outside" in problems["decode"] and "points outside" in problems["prefill"]
    assert "is a folder, expected a file" in problems["batch-positions"]
    assert problems["prefill-decode"] is None and s.exit_code == 2


def test_fixtures_check_reads_nothing_a_manifest_points_outside(fixture_copy, tmp_path, capsys):
    """A manifest naming '../file' (with the right checksum there) is refused, not followed: that entry is
    unusable (exit 2, one line), every other case still checked (issue 43: as verify judges them)."""
    doc = json.loads((fixture_copy / "manifest.json").read_text())
    doc["cases"] = [c for c in doc["cases"] if c["id"].startswith(("prefill_T1_", "decode_T12"))]
    victim = doc["cases"][0]
    shutil.copy(fixture_copy / victim["file"], tmp_path / victim["file"])
    victim["file"] = f"../{victim['file']}"
    (fixture_copy / "manifest.json").write_text(json.dumps(doc))
    report = {r["id"]: r for r in check_suite(fixture_copy)}
    assert report[victim["id"]]["status"] == "unusable" and "points outside" in report[victim["id"]]["detail"]
    assert report[doc["cases"][1]["id"]]["status"] == "identical"
    assert main(["fixtures", "check", "--fixtures", str(fixture_copy), "--quiet"]) == 2
    out = capsys.readouterr().out
    assert "points outside" in out and sum(ln.startswith("unusable ") for ln in out.splitlines()) == 1


def test_the_report_reads_no_file_a_summary_points_elsewhere(fixtures_dir, tmp_path):
    """A record's file name outside the folders the summary records is never opened."""
    from gdncheck.conformance.judge.verify import verify
    from gdncheck.reports import write_report
    from gdncheck.reports.tensors import CaseFiles

    out = tmp_path / "out"
    perfect_outputs(fixtures_dir, "decode_T12", out, alter=lambda t: t["calls.0.out"].__imul__(1.5))
    doc = verify(fixtures_dir, out, "f32", cases=["decode_T12"]).to_json()
    secret = tmp_path / "secret.safetensors"
    shutil.copy(out / f"{DECODE}.safetensors", secret)
    (out / f"{DECODE}.safetensors").unlink()
    rec = next(r for r in doc["cases"][0]["records"] if r["verdict"] == "fail")
    rec["actual_ref"]["file"] = str(secret)
    files = CaseFiles(None, None, {"expected": doc["fixtures"]["dir"], "actual": doc["outputs"]["dir"]})
    arr, note = files.read("actual", rec["actual_ref"], rec["shape"])
    assert arr is None and "outside the summary's folder" in note
    index = write_report(doc, tmp_path / "site")
    assert "outside the summary" in (index.parent / "cases" / f"{DECODE}.html").read_text()


def test_a_pinned_suite_is_the_suite(fixture_copy, tmp_path, capsys):
    pin = sha256_file(fixture_copy / "manifest.json")
    doc = json.loads((fixture_copy / "manifest.json").read_text())
    doc["cases"] = [c for c in doc["cases"] if c["kind"] == "forward"]  # another suite: its files still match
    (fixture_copy / "manifest.json").write_text(json.dumps(doc))
    load_manifest(fixture_copy)
    res = run_gate(GateOptions(impl="reference", profiles=("f32",), fixtures=str(fixture_copy), cases=["prefill_T1_"],
                               fixtures_sha256=pin, out=str(tmp_path / "g"), properties=False, jobs=1))
    assert res.exit_code == 2 and "--fixtures-sha256 pins" in res.reason
    code = main(["verify", "--fixtures", str(fixture_copy), "--outputs", str(tmp_path), "--profile", "f32",
                 "--fixtures-sha256", pin])
    assert code == 2 and "--fixtures-sha256 pins" in capsys.readouterr().err


def test_safe_path_refuses_every_way_out(tmp_path):
    from gdncheck.untrusted import UnsafePathError, safe_path

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "out").symlink_to(tmp_path)
    (tmp_path / "d" / "dev").symlink_to("/dev/null")
    os.mkfifo(tmp_path / "d" / "pipe")
    for name, why in [("/etc/passwd", "absolute"), ("../x", "outside"), ("a/../../x", "outside"),
                      ("out/x", "outside"), ("dev", "outside"), ("pipe", "a pipe"), ("", "non-empty"),
                      ("a\\b", "backslash"), ("a\x1b[2Kb", "control"), (".", "'.'"), ("C:/x", "absolute")]:
        with pytest.raises(UnsafePathError, match=why):
            safe_path(tmp_path / "d", name)
    assert safe_path(tmp_path / "d", "sub/new.safetensors") == (tmp_path / "d" / "sub" / "new.safetensors").resolve()
