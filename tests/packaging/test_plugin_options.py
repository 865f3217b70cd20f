"""The pytest plugin as a port's project lives with it: --gdncheck-option for the factory (checked as
gdncheck run's --option), --gdncheck-xfails (the known-failures format of verify and the gate: listed
cases xfail, strict), the likely cause in a failure's text, and the outputs kept where the repro
line points (.gdncheck-out/ under the rootdir by default), so the repro works after the run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

PORT = """
from gdncheck.conformance.meta import mutants
from gdncheck.conformance.ports.implementations import reference


def factory(cfg, weights, *, profile, strict=False, bug=False):
    make = mutants.gated_norm_weight_one_plus if bug else reference
    return make(cfg, weights, profile=profile, strict=strict)
"""
# -k matches substrings: not d128-spec-decode_T12, nor the depth case snapshot-decode_T12_Hk2_Hv6
DECODE, PREFILL = "decode_T12_Hk2_Hv4", "prefill_T1_"
LATE = "gated_norm,out_proj,residual,post_norm,mlp,output"  # where the bug shows, and nowhere before


@pytest.fixture
def port(pytester):
    from importlib.metadata import entry_points

    if not any(ep.value == "gdncheck.testing.plugin" for ep in entry_points(group="pytest11")):
        pytest.fail("gdncheck's pytest11 entry point is not installed in this environment: pip install --no-deps -e .")
    pytester.makepyfile(myport=PORT)
    return pytester


def _run(port, *args):
    return port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-profile", "f32", "-p", "no:cacheprovider",
                          "-rxX", "-k", f"{DECODE} or {PREFILL}", *args)


def test_options_xfails_likely_cause_and_a_repro_that_works_after_the_run(port):
    xf = port.path / "xfails.txt"
    xf.write_text(f"# our known failures\nmyport:factory f32 {DECODE} {LATE}  # the gated norm, issue 7\n"
                  f"* * {PREFILL} gated_norm  # only the norm (it fails beyond)\n")
    result = _run(port, "--gdncheck-option", "bug=true", "--gdncheck-xfails", str(xf))
    result.assert_outcomes(xfailed=1, failed=1, deselected=len(_cases()) - 2)
    text = result.stdout.str()
    assert "known failure (" in text and "xfails.txt:2): the gated norm, issue 7" in text
    assert f"FAIL  {PREFILL}" in text and "      likely cause: " in text  # verify's diagnosis, as the CLI's
    out = port.path / ".gdncheck-out"
    assert f"outputs kept in {out}" in text  # the header says where
    repro = next(line.split("repro: ", 1)[1] for line in result.outlines if "repro: " in line)
    # a port of the user's own: the repro re-judges the kept outputs (verify alone; issue 43: a module named by
    # an outputs file is never pasted into a command)
    assert repro.startswith("gdncheck verify ") and str(out) in repro and "myport" not in repro
    # after the session: the folder is still there, and the repro line runs as printed
    assert out.is_dir() and any(out.glob(f"{PREFILL}*.safetensors"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(repro, shell=True, cwd=port.path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]  # does not conform: reproduced
    assert f"FAIL  {PREFILL}" in done.stdout + done.stderr


def test_a_listed_case_that_passes_is_strict_xpass(port):
    xf = port.path / "xfails.txt"
    xf.write_text(f"* f32 {DECODE} *  # fixed since?\n")
    result = _run(port, "--gdncheck-xfails", str(xf))  # no bug: every case passes
    result.assert_outcomes(passed=1, failed=1, deselected=len(_cases()) - 2)
    assert "XPASS(strict)" in result.stdout.str() and "fixed since?" in result.stdout.str()


def test_usage_errors_and_the_folder_it_owns(port):
    result = _run(port, "--gdncheck-option", "nosuch=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "--gdncheck-option: " in result.stderr.str() \
        and "'nosuch'" in result.stderr.str()
    (port.path / "bad.txt").write_text("* f32 decode core\n")
    result = _run(port, "--gdncheck-xfails", str(port.path / "bad.txt"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "bad.txt:1: a known failure needs its reason" in \
        result.stderr.str()
    mine = port.path / ".gdncheck-out"
    mine.mkdir()
    (mine / "notes.txt").write_text("someone's")
    result = _run(port, "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "left as it is" in result.stderr.str()
    assert (mine / "notes.txt").read_text() == "someone's"
    (mine / "notes.txt").unlink()
    result = _run(port, "--collect-only")  # an empty folder is taken, marked, and then replaced at each run
    assert result.ret == 0 and (mine / ".gdncheck-pytest").is_file() and (mine / ".gitignore").is_file()
    (mine / "old.safetensors").write_bytes(b"stale")
    assert _run(port, "--collect-only").ret == 0 and not (mine / "old.safetensors").exists()


def _cases() -> list[str]:
    import json

    from gdncheck.fixtures.manifest import DEFAULT_DIR

    return [c["id"] for c in json.loads((DEFAULT_DIR / "manifest.json").read_text())["cases"]]


def test_the_help_names_the_options(port):
    text = port.runpytest("--help").stdout.str()
    for flag in ("--gdncheck-option", "--gdncheck-xfails", "--gdncheck-diagnose", "--gdncheck-out"):
        assert re.search(rf"^\s+{flag}\b", text, re.M), flag
