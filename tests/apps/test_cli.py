"""The console script: --version, --help, the demo, and errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys

import pytest

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


@pytest.mark.parametrize("argv,says", [
    (["gate", "--layer", "x"], "unrecognized arguments: --layer x (usage: gdncheck --help)"),
    (["bogus"], "invalid choice: 'bogus'"),
    (["verify", "--profile", "q"], "gdncheck verify: error: argument --profile: invalid choice: 'q'"),
    (["gate", "--jobs", "x"], "gdncheck gate: error: argument --jobs: invalid int value: 'x'"),
    (["run"], "the following arguments are required: IMPL, --out, --profile"),
    (["verify", "--profile", "f32\x1b[2Jx"], "\\x1b[2Jx"),  # a control character shown, not obeyed
    ([], "expected a command (demo, bench, fixtures, run, verify, engines, report, tolerances, gate, template, "
         "gpu-bench), found none"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, says, capsys):
    """A bad command line: exit 2 and one line on stderr saying what was wrong (argparse would print
    its usage block first)."""
    with pytest.raises(SystemExit) as exc:
        sys.exit(main(argv))
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err and "\x1b" not in err, err


@pytest.mark.parametrize("module", ["gdncheck.conformance.meta", "gdncheck.conformance.properties",
                                    "gdncheck.gpu_tools.compile_check", "gdncheck.bench"])
def test_module_entry_points_say_usage_errors_in_one_line(module):
    r = subprocess.run([sys.executable, "-m", module, "--no-such-option"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"python -m {module}: error: unrecognized arguments: --no-such-option"), r.stderr
