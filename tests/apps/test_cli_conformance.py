"""The command line: fixtures, run, verify, tolerances; exit codes 0/1/2 and no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gdncheck.cli import main


def test_run_then_verify_exit_codes(fixtures_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "reference", "--profile", "f16", "--out", str(out), "--case", "decode_T12",
                 "--case", "error-input-dtype"]) == 0
    assert main(["verify", "--outputs", str(out), "--profile", "f16", "--case", "decode_T12",
                 "--case", "error-input-dtype"]) == 0
    text = capsys.readouterr().out
    assert "conforms: 2/2 cases pass" in text
    summary = json.loads((out / "verify-summary-f16.json").read_text())
    assert summary["exit_code"] == 0 and summary["implementation"]["name"].startswith("reference (f16 emulated")

    bad = tmp_path / "bad"
    assert main(["run", "gdncheck.conformance.meta.mutants:gate_before_norm", "--profile", "f32", "--out", str(bad),
                 "--case", "decode_T12"]) == 0
    assert main(["verify", "--outputs", str(bad), "--profile", "f32", "--case", "decode_T12",
                 "--summary", str(tmp_path / "s.json")]) == 1
    text = capsys.readouterr().out
    assert "FAIL  decode_T12_Hk2_Hv4_dk16_dv16_s0: first divergence call 0, stage gated_norm, tensor core_gated" in text
    repro = next(line for line in text.splitlines() if line.strip().startswith("repro: "))
    assert "gdncheck run gdncheck.conformance.meta.mutants:gate_before_norm" in repro and "&& gdncheck verify" in repro

    # a mistyped outputs folder: one error naming it (not one per case), and nothing created
    assert main(["verify", "--outputs", str(tmp_path / "nothing"), "--profile", "f32", "--case", "decode_T12"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and str(tmp_path / "nothing") in cap.err
    assert "expected the port's outputs folder, found nothing" in cap.err  # before any case
    assert not (tmp_path / "nothing").exists()
    (tmp_path / "empty").mkdir()
    assert main(["verify", "--outputs", str(tmp_path / "empty"), "--profile", "f32", "--case", "decode_T12"]) == 2
    assert "ERROR decode_T12" in capsys.readouterr().out


def test_errors_are_one_line_without_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gdncheck.cli", "verify", "--fixtures", str(tmp_path), "--outputs",
                        str(tmp_path), "--profile", "bf16"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("gdncheck verify: error: expected a fixture folder with manifest.json")
    r = subprocess.run([sys.executable, "-m", "gdncheck.cli", "run", "no.such.module:factory", "--out", str(tmp_path),
                        "--profile", "f32"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot import module 'no.such.module'" in r.stderr and "Traceback" not in r.stderr


def test_triton_without_gpu_impl_layer_is_a_clear_error(tmp_path, capsys, monkeypatch):
    import gdncheck.gpu_impl as gpu_impl

    monkeypatch.delattr(gpu_impl, "Layer", raising=False)
    assert main(["run", "triton", "--profile", "f32", "--out", str(tmp_path), "--case", "decode_T12"]) == 0
    summary_exit = main(["verify", "--outputs", str(tmp_path), "--profile", "f32", "--case", "decode_T12"])
    text = capsys.readouterr().out
    assert summary_exit == 1 and "needs gdncheck.gpu_impl.Layer" in text


def test_fixtures_list_check_and_tolerances_show(capsys):
    assert main(["fixtures", "list"]) == 0
    assert "long-decode_T2548_Hk1_Hv2_dk8_dv8_s0" in capsys.readouterr().out
    assert main(["tolerances", "show", "--case", "long-decode_T2548_Hk1_Hv2_dk8_dv8_s0"]) == 0
    text = capsys.readouterr().out
    assert "case long-decode_T2548_Hk1_Hv2_dk8_dv8" in text and "recurrent_state" in text


def test_tolerances_show_properties(capsys):
    """--properties prints the rows that judge generated layers: the packaged table's numbers."""
    from gdncheck.conformance.judge.tolerances import load_table

    assert main(["tolerances", "show", "--properties"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("properties; elem = scaled elementwise error, nmse = per-call NMSE")
    core = next(line.split() for line in lines if line.startswith("core "))
    want = load_table().data["modes"]["end_to_end"]["bf16"]["properties"]["core"]["elem"]
    assert float(core[3]) == pytest.approx(want, rel=1e-2)  # columns: f32 elem, f32 nmse, bf16 elem, ...
    assert main(["tolerances", "show", "--properties", "--case", "decode_T12"]) == 2
    assert "expected --properties alone" in capsys.readouterr().err
