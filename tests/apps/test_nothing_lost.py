"""Nothing lost (issue 11, item 4): no command overwrites or deletes goldens or files it was not asked
to; ``fixtures build`` prunes only with ``--prune`` and has no default output inside the package;
interrupted writes leave nothing a later command accepts; no stale verdict survives a run."""

from __future__ import annotations

import json
import os

import pytest

from gdncheck import safetensors_io
from gdncheck.cli import main
from gdncheck.fixtures.manifest import load_manifest
from gdncheck.gate import GateOptions, run_gate
from tests.fixtures.outputs import perfect_outputs
from tests.helpers import default_case_id


def _digests(folder) -> dict[str, int]:
    return {p.name: hash(p.read_bytes()) for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("where", ["suite", "inside", "around"])
def test_run_and_gate_refuse_to_write_into_or_around_a_suite(fixture_copy, where, capsys):
    out = {"suite": fixture_copy, "inside": fixture_copy / "out", "around": fixture_copy.parent}[where]
    before = _digests(fixture_copy)
    code = main(["run", "reference", "--fixtures", str(fixture_copy), "--out", str(out), "--profile", "f32",
                 "--case", "prefill_T1_"])
    err = capsys.readouterr().err
    assert code == 2 and "suite" in err and "Traceback" not in err
    with pytest.raises(Exception, match="suite"):
        run_gate(GateOptions(impl="reference", profiles=("f32",), fixtures=str(fixture_copy), cases=["prefill_T1_"],
                             out=str(out), properties=False, jobs=1))
    assert _digests(fixture_copy) == before and not (fixture_copy / "out").exists()
    assert not (fixture_copy / "f32").exists() and not (fixture_copy / "gate-summary.json").exists()


def test_fixtures_build_keeps_the_cases_it_did_not_build(fixture_copy, capsys):
    before = load_manifest(fixture_copy)
    assert main(["fixtures", "build", "--out", str(fixture_copy), "--case", "error-invalid-eps"]) == 0
    after = load_manifest(fixture_copy)
    assert [c["id"] for c in after["cases"]] == [c["id"] for c in before["cases"]]  # same cases, same order
    assert all((fixture_copy / c["file"]).is_file() for c in after["cases"])
    assert main(["fixtures", "check", "--fixtures", str(fixture_copy), "--quiet"]) == 0
    assert main(["fixtures", "build", "--out", str(fixture_copy), "--case", "error-invalid-eps", "--prune"]) == 0
    pruned = load_manifest(fixture_copy)
    assert [c["id"].split("_")[0] for c in pruned["cases"]] == ["error-invalid-eps"]
    assert sorted(p.name for p in fixture_copy.glob("*.safetensors")) == [pruned["cases"][0]["file"]]
    capsys.readouterr()


def test_fixtures_build_refuses_folders_it_would_damage(tmp_path, fixture_copy, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "manifest.json").write_text('{"my": "own file"}')
    (mine / "notes.txt").write_text("keep me")
    assert main(["fixtures", "build", "--out", str(mine), "--case", "error-invalid-eps"]) == 2
    assert "cannot be read" in capsys.readouterr().err and (mine / "manifest.json").read_text() == '{"my": "own file"}'
    (mine / "manifest.json").unlink()
    assert main(["fixtures", "build", "--out", str(mine), "--case", "error-invalid-eps"]) == 2
    cap = capsys.readouterr()
    assert "not empty and holds no fixture suite" in cap.err
    assert " MB" not in cap.out  # refused before a case was built, not after the work
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    before = _digests(fixture_copy)
    assert main(["fixtures", "build", "--suite", "full", "--out", str(fixture_copy), "--case", "x"]) == 2
    assert _digests(fixture_copy) == before
    capsys.readouterr()


def test_fixtures_build_writes_nothing_into_the_package_by_default(fixture_copy, tmp_path, monkeypatch, capsys):
    """The default --out is a folder of the working directory, never the installed suite."""
    import gdncheck.fixtures.manifest as manifest

    monkeypatch.setattr(manifest, "DEFAULT_DIR", fixture_copy)  # stands in for the packaged suite
    monkeypatch.chdir(tmp_path)
    before = _digests(fixture_copy)
    assert main(["fixtures", "build", "--case", "error-invalid-eps"]) == 0
    assert _digests(fixture_copy) == before
    assert [c["id"].split("_")[0] for c in load_manifest(tmp_path / "fixtures-default")["cases"]] == \
        ["error-invalid-eps"]
    capsys.readouterr()


def test_an_interrupted_write_leaves_nothing_a_later_command_accepts(fixtures_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    perfect_outputs(fixtures_dir, "prefill_T1_", out)

    def killed(src, dst):
        raise KeyboardInterrupt  # the process stopped between writing and renaming

    monkeypatch.setattr(safetensors_io.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        perfect_outputs(fixtures_dir, "decode_T12", out)
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == ["prefill_T1_Hk1_Hv1_dk16_dv16_s0.safetensors"]
    # what a killed writer (no cleanup) leaves: a temporary file, and a truncated file in place
    (out / f".{default_case_id('decode')}.safetensors.x1.part").write_bytes(b"\0" * 64)
    good = out / "prefill_T1_Hk1_Hv1_dk16_dv16_s0.safetensors"
    good.write_bytes(good.read_bytes()[:-100])
    code = main(["verify", "--outputs", str(out), "--profile", "f32", "--case", "prefill_T1_", "--case", "decode_T12"])
    text = capsys.readouterr().out
    assert code == 2 and "ERROR prefill_T1_" in text and "ERROR decode_T12" in text and "no outputs file" in text


def test_no_stale_verdict_survives_a_run_that_cannot_finish(fixtures_dir, fixture_copy, tmp_path, capsys):
    out = tmp_path / "out"
    perfect_outputs(fixtures_dir, "prefill_T1_", out)
    assert main(["verify", "--outputs", str(out), "--profile", "f32", "--case", "prefill_T1_",
                 "--junit", str(tmp_path / "j.xml")]) == 0
    assert json.loads((out / "verify-summary-f32.json").read_text())["verdict"] == "conforms"
    (fixture_copy / "manifest.json").write_text("{ not json")
    code = main(["verify", "--fixtures", str(fixture_copy), "--outputs", str(out), "--profile", "f32",
                 "--junit", str(tmp_path / "j.xml")])
    assert code == 2 and "not a readable JSON manifest" in capsys.readouterr().err
    assert not (out / "verify-summary-f32.json").exists() and not (tmp_path / "j.xml").exists()


def test_the_gate_replaces_only_its_own_folders(tmp_path):
    out = tmp_path / "gate"
    (out / "f32").mkdir(parents=True)
    (out / "f32" / "mine.txt").write_text("someone's")
    res = run_gate(GateOptions(impl="reference", profiles=("f32",), cases=["prefill_T1_"], out=str(out),
                               properties=False, jobs=1, rebuild_check=False))
    assert res.exit_code == 2 and "not written by gdncheck gate" in res.reason
    assert (out / "f32" / "mine.txt").read_text() == "someone's"
    (out / "f32" / "mine.txt").unlink()
    res = run_gate(GateOptions(impl="reference", profiles=("f32",), cases=["prefill_T1_"], out=str(out),
                               properties=False, jobs=1, rebuild_check=False))
    assert res.exit_code == 0, res.reason
    stale = out / "f32" / f"{default_case_id('decode')}.safetensors"
    stale.write_bytes(b"an earlier run's file")
    res = run_gate(GateOptions(impl="reference", profiles=("f32",), cases=["prefill_T1_"], out=str(out),
                               properties=False, jobs=1, rebuild_check=False))
    assert res.exit_code == 0 and not stale.exists()  # the folder is the gate's: replaced whole
    assert os.path.isfile(out / "f32" / ".gdncheck-gate")
