"""Trust, fourth round (issue 43, item 6): the pytest plugin's bad options are one usage error, and it
writes only into a folder of its own.

Each test failed on main at ad695e6: ``--gdncheck-max-examples -5`` (or 0) failed each property test
with Hypothesis's InvalidArgument and 10**20 was accepted; ``--gdncheck-out DIR`` wrote its outputs
beside a user's files although docs/plugins.md says such a folder is refused; a file the plugin did
not make in its outputs folder failed the case with a traceback of hundreds of lines.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

PORT = """
from gdncheck.conformance.ports.implementations import reference


def factory(cfg, weights, *, profile, strict=False):
    return reference(cfg, weights, profile=profile, strict=strict)
"""
CASE = "prefill_T1_Hk1_Hv1_dk16_dv16_s0"


@pytest.fixture
def port(pytester):
    pytester.makepyfile(myport=PORT)
    return pytester


def _usage_error(result, *words: str) -> str:
    err = [line for line in result.errlines if line.strip()]
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-3000:]
    assert len(err) == 1 and err[0].startswith("ERROR: gdncheck: "), result.errlines
    for w in words:
        assert w in err[0], (w, err[0])
    return err[0]


@pytest.mark.parametrize("value", ["-5", "0", str(10**20), "1e3", "many"])
def test_max_examples_out_of_range_is_one_usage_error(port, value):
    result = port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-properties", "--gdncheck-max-examples",
                            value, "-k", "beta_zero", "-p", "no:cacheprovider")
    _usage_error(result, "--gdncheck-max-examples", "from 1 to 100000", repr(value))
    assert not (port.path / ".gdncheck-out").exists()  # refused before the folder is made


def test_max_examples_in_range_runs(port):
    result = port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-properties", "--gdncheck-max-examples",
                            "1", "-k", "beta_zero", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "examples per property, 1..100000" in port.runpytest("--help").stdout.str()


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("foreign", ["notes.txt", f"{CASE}.safetensors"])
def test_a_users_folder_given_as_out_is_refused(port, foreign):
    mine = port.path / "mine"
    mine.mkdir()
    (mine / foreign).write_text("someone's\n")
    before = _tree(mine)
    result = port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-out", str(mine), "-k", "prefill_T1_",
                            "-p", "no:cacheprovider")
    _usage_error(result, "--gdncheck-out", str(mine), "left as it is")
    assert _tree(mine) == before and sorted(p.name for p in mine.iterdir()) == [foreign]


def test_a_given_out_is_the_plugins_own_folder(port):
    out = port.path / "out"
    result = port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-out", str(out), "-k", "prefill_T1_",
                            "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, deselected=result.parseoutcomes()["deselected"])
    assert (out / ".gdncheck-pytest").is_file() and (out / f"{CASE}.safetensors").is_file()
    (out / "stale.safetensors").write_bytes(b"an earlier run's")
    result = port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-out", str(out), "-k", "prefill_T1_",
                            "-p", "no:cacheprovider")
    assert result.ret == 0 and not (out / "stale.safetensors").exists()  # marked: replaced whole


def test_a_file_it_did_not_make_fails_the_case_in_one_line(port):
    """A file of someone's that appears in the outputs folder after it was made (here: by a conftest
    hook) is never replaced, and the case fails with one line, not a traceback."""
    out = port.path / "out"
    port.makeconftest(f"""
from pathlib import Path

def pytest_collection_finish(session):
    Path({str(out)!r}, "{CASE}.safetensors").write_text("someone's notes")
""")
    result = port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-out", str(out), "-k", "prefill_T1_",
                            "-p", "no:cacheprovider", "--gdncheck-diagnose", "0")
    result.assert_outcomes(failed=1, deselected=result.parseoutcomes()["deselected"])
    text = result.stdout.str()
    assert "gdncheck could not run this case: " in text and "never replaces a file it did not make" in text
    assert "Traceback" not in text and len(result.outlines) < 40, len(result.outlines)
    assert (out / f"{CASE}.safetensors").read_text() == "someone's notes"
