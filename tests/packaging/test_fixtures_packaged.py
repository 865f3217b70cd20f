"""The committed suite as a pip user gets it (fixtures/packaged.py): located, verified, exported; and
gdncheck never writing into an installed package (gdncheck/installed.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gdncheck import installed
from gdncheck.cli import main
from gdncheck.fixtures.manifest import DEFAULT_DIR, FixtureError
from gdncheck.fixtures.packaged import default_suite, export_suite, verify_suite


def test_path_prints_the_verified_committed_suite(capsys):
    assert main(["fixtures", "path"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == DEFAULT_DIR == default_suite()
    doc = json.loads((printed / "manifest.json").read_text())
    for case in doc["cases"]:  # an independent check of what "verified" promises
        assert hashlib.sha256((printed / case["file"]).read_bytes()).hexdigest() == case["sha256"]


def test_export_copies_every_file_byte_for_byte(tmp_path, capsys):
    dest = tmp_path / "vendor" / "gdncheck-fixtures"
    assert main(["fixtures", "export", str(dest)]) == 0
    assert "checksums verified" in capsys.readouterr().out
    names = sorted(p.name for p in DEFAULT_DIR.iterdir() if p.is_file())
    assert sorted(p.name for p in dest.iterdir()) == names
    for name in names:
        assert (dest / name).read_bytes() == (DEFAULT_DIR / name).read_bytes()
    # a second export into the same, now full, folder is one error naming it, and changes nothing
    before = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}
    assert main(["fixtures", "export", str(dest), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(dest) in err[0]
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir()} == before


def test_a_damaged_copy_is_refused_naming_the_case(tmp_path):
    copy = tmp_path / "suite"
    shutil.copytree(DEFAULT_DIR, copy)
    doc = json.loads((copy / "manifest.json").read_text())
    victim = doc["cases"][3]
    data = bytearray((copy / victim["file"]).read_bytes())
    data[-1] ^= 0x01  # same size, one bit of the last tensor flipped
    (copy / victim["file"]).write_bytes(bytes(data))
    with pytest.raises(FixtureError, match=victim["id"]):
        verify_suite(copy)
    with pytest.raises(FixtureError, match=f"1 of {len(doc['cases'])} "):
        export_suite(tmp_path / "out", source=copy)
    assert not (tmp_path / "out" / "manifest.json").exists()


def fake_install(monkeypatch, tmp_path) -> Path:
    """gdncheck seen as installed in site-packages: no source checkout, its package folder elsewhere."""
    package = tmp_path / "site-packages" / "gdncheck"
    (package / "fixtures" / "default").mkdir(parents=True)
    monkeypatch.setattr(installed, "PACKAGE_DIR", package)
    monkeypatch.setattr(installed, "source_checkout", lambda: None)
    return package


def test_installed_package_is_never_written(monkeypatch, tmp_path, capsys):
    package = fake_install(monkeypatch, tmp_path)
    target = package / "fixtures" / "default"
    for argv in (["fixtures", "build", "--out", str(target), "--case", "decode"],
                 ["fixtures", "export", str(package / "copy")],
                 ["tolerances", "derive", "--out", str(package / "conformance" / "judge" / "tolerances.json")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "installed gdncheck package" in err[0], argv
    assert sorted(p.relative_to(package).as_posix() for p in package.rglob("*")) == ["fixtures", "fixtures/default"]
    # outside the package the same build goes ahead
    installed.refuse_write_into_package(tmp_path / "mine", "--out")


def test_a_source_checkout_is_recognised():
    # this suite runs from the repository (an editable install): its files are the ones committed
    assert installed.source_checkout() == Path(__file__).resolve().parents[2]


def test_python_m_gdncheck_is_the_cli():
    out = subprocess.run([sys.executable, "-m", "gdncheck", "--version"], capture_output=True, text=True, timeout=60)
    from gdncheck import __version__

    assert out.returncode == 0 and out.stdout.strip() == f"gdncheck {__version__}"
