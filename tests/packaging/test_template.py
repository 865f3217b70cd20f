"""`gdncheck template node --out DIR`: the Node.js runner template of examples/ports/node/, shipped in
the wheel (pyproject: gdncheck.templates), copied into a new or empty folder, a non-empty one refused."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gdncheck.cli import main
from gdncheck.commands.template import template_dir

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "examples" / "ports" / "node"


def test_copies_the_template_into_a_new_folder(tmp_path, capsys):
    dest = tmp_path / "port" / "runner"
    assert main(["template", "node", "--out", str(dest)]) == 0
    names = sorted(p.name for p in SOURCE.iterdir() if p.is_file())
    assert sorted(p.name for p in dest.iterdir()) == names and "run.js" in names
    for name in names:
        assert (dest / name).read_bytes() == (SOURCE / name).read_bytes()
    assert "node " + str(dest / "run.js") in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["template", "node", "--out", str(empty), "-q"]) == 0 and (empty / "run.js").is_file()
    assert capsys.readouterr().out == ""


def test_refuses_a_folder_holding_anything(tmp_path, capsys):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    assert main(["template", "node", "--out", str(dest)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "expected a new or empty folder" in err
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]
    (tmp_path / "file").write_text("x")
    assert main(["template", "node", "--out", str(tmp_path / "file")]) == 2
    assert "found a file" in capsys.readouterr().err


def test_the_template_is_package_data():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert doc["package-dir"]["gdncheck.templates"] == "examples/ports"
    assert doc["package-data"]["gdncheck.templates"] == ["node/*"]
    assert (template_dir("node") / "run.js").is_file()  # in a source checkout: examples/ports/node


@pytest.mark.skipif(shutil.which("node") is None, reason="no node on this machine")
def test_the_copy_runs_and_verify_judges_it(tmp_path):
    dest = tmp_path / "runner"
    assert main(["template", "node", "--out", str(dest), "-q"]) == 0
    from gdncheck.fixtures.manifest import DEFAULT_DIR

    out = subprocess.run(["node", str(dest / "run.js"), "--fixtures", str(DEFAULT_DIR), "--out", str(tmp_path / "o"),
                          "--case", "decode_T12"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert main(["verify", "--outputs", str(tmp_path / "o"), "--profile", "f32", "--case", "decode_T12"]) == 0
