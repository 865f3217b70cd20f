"""The console script: --version, --help, the demo, and errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys

from gdncheck import __version__
from gdncheck.cli import main


def _run(*args):
    return subprocess.run([sys.executable, "-m", "gdncheck.cli", *args], capture_output=True, text=True, timeout=300)


def test_version_and_help():
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"gdncheck {__version__}"
    r = _run("--help")
    assert r.returncode == 0 and "demo" in r.stdout and "Gated DeltaNet" in r.stdout


def test_demo_runs_and_checks(capsys):
    assert main(["demo", "--tokens", "20", "--decode", "3"]) == 0
    out = capsys.readouterr().out
    assert "delta_rule   core" in out
    assert out.count("ok ") == 4


def test_gdn_error_exits_2_without_traceback(monkeypatch, capsys):
    from gdncheck.commands import demo
    from gdncheck.errors import MissingWeightError

    def boom(args):
        raise MissingWeightError("expected it, found nothing", layer=1, name="mlp.up_proj.weight")

    monkeypatch.setattr(demo, "run", boom)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gdncheck demo: error: expected it, found nothing [layer 1, 'mlp.up_proj.weight']")
    assert "Traceback" not in err
