"""CLI conventions a CI owner relies on: MODULE:CALLABLE found in the working directory by the
console script, the summary as JSON on stdout with the human lines on stderr, -q, and a mistyped
path as one error naming it with nothing created."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdncheck.cli import main
from tests.helpers import default_case_id

CASE = default_case_id("decode")
PORT = """
from gdncheck.conformance.ports.implementations import reference

def factory(cfg, weights, *, profile, strict=False, **options):
    return reference(cfg, weights, profile=profile, strict=strict, **options)
"""


def console_script() -> str:
    script = Path(sys.executable).with_name("gdncheck")
    if not script.exists():
        pytest.fail(f"no console script beside {sys.executable} (pip install -e .)")
    return str(script)


def test_run_finds_a_module_in_the_working_directory(tmp_path):
    (tmp_path / "cwdport.py").write_text(PORT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # the console script's interpreter, as a user's shell runs it: the working directory is not on sys.path
    cmd = [sys.executable, "-c", "import sys; from gdncheck.cli import main; sys.exit(main())"]
    script = [*cmd, "run", "cwdport:factory", "--profile", "f32", "--out", "out", "--case", CASE, "-q"]
    out = subprocess.run(script, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "out" / f"{CASE}.safetensors").is_file()
    # -q: the one summary line, no line per case
    assert out.stdout.splitlines() == [l for l in out.stdout.splitlines() if l.startswith("ran 1 case(s)")]
    assert console_script()  # the installed entry point exists too (it calls the same main)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs")
    assert main(["run", "reference", "--profile", "f32", "--out", str(out), "--case", CASE, "-q"]) == 0
    return out


@pytest.mark.parametrize("flag", [["--json"], ["--summary", "-"]])
def test_verify_json_on_stdout_human_lines_on_stderr(outputs, capsys, flag):
    for stale in outputs.glob("verify-summary-*.json"):
        stale.unlink()
    assert main(["verify", "--outputs", str(outputs), "--profile", "f32", "--case", CASE, *flag]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)  # stdout is the summary alone
    assert doc["profile"] == "f32" and [c["id"] for c in doc["cases"]] == [CASE]
    assert doc["cases"][0]["status"] == "pass"
    assert f"pass  {CASE}" in cap.err and "conforms: 1/1 cases pass" in cap.err
    assert (outputs / "verify-summary-f32.json").exists() == (flag == ["--json"])  # '-' writes no file


def test_verify_quiet_keeps_the_verdict_only(outputs, capsys):
    assert main(["verify", "--outputs", str(outputs), "--profile", "f32", "--case", CASE, "-q"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # no line per case: the coverage line and the verdict
    assert len(lines) == 2 and lines[0].startswith("coverage: 1 of 1 case(s) judged")
    assert lines[1].startswith("conforms: 1/1 cases pass")


def test_a_mistyped_outputs_folder_is_one_error_and_creates_nothing(tmp_path, capsys):
    typo = tmp_path / "ouputs"
    assert main(["verify", "--outputs", str(typo), "--profile", "f32"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and str(typo) in cap.err
    assert not typo.exists()
    assert main(["run", "reference", "--fixtures", str(tmp_path / "fixturez"), "--out", str(tmp_path / "o"),
                 "--profile", "f32"]) == 2
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and "fixturez" in cap.err and not (tmp_path / "o").exists()


def test_quiet_fixtures_build_and_check(tmp_path, capsys):
    assert main(["fixtures", "build", "--out", str(tmp_path / "built"), "--case", "decode", "-q"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "1 cases" in lines[0]
    assert main(["fixtures", "check", "--fixtures", str(tmp_path / "built"), "-q"]) == 0
    assert capsys.readouterr().out.strip().splitlines() == ["1/1 cases reproduce"]
