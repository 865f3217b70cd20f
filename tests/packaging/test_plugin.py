"""The pytest plugin (gdncheck/testing/plugin.py, entry point pytest11) and assert_conforms, run the
way a port's own test suite runs them: pytester sessions in a folder holding the port's module."""

from __future__ import annotations

import json

import pytest

from gdncheck.conformance.properties import PROPERTIES
from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.testing import NonConformance, assert_conforms

pytest_plugins = ["pytester"]

MANIFEST = json.loads((DEFAULT_DIR / "manifest.json").read_text())
CASES = [c["id"] for c in MANIFEST["cases"]]
PORT = """
from gdncheck.conformance.ports.implementations import reference

def factory(cfg, weights, *, profile, strict=False, **options):
    return reference(cfg, weights, profile=profile, strict=strict, **options)
"""
MUTANT = "gdncheck.conformance.meta.mutants:norm_weight_plain"  # x_norm wrong from the first token


@pytest.fixture
def port(pytester):
    from importlib.metadata import entry_points

    if not any(ep.value == "gdncheck.testing.plugin" for ep in entry_points(group="pytest11")):
        pytest.fail("gdncheck's pytest11 entry point is not installed in this environment (an install older than "
                    "the plugin): pip install --no-deps -e .")
    pytester.makepyfile(myport=PORT)
    return pytester


def ids_of(result) -> list[str]:
    return [line.split("::", 1)[1].strip() for line in result.outlines if line.startswith("gdncheck-")]


def test_one_test_per_case_with_the_case_id(port):
    result = port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-profile", "bf16", "--collect-only", "-q")
    assert result.ret == 0
    assert ids_of(result) == CASES


def test_tags_are_markers_and_k_selects(port):
    decode = [c for c in MANIFEST["cases"] if "decode" in c["tags"] and "long" not in c["tags"]]
    sharded = [c for c in decode if "sharded" in c["tags"]]  # not applicable to a port without sharded methods
    result = port.runpytest("--gdncheck-impl", "myport:factory", "-m", "decode and not long")
    result.assert_outcomes(passed=len(decode) - len(sharded), skipped=len(sharded),
                           deselected=len(CASES) - len(decode))
    result = port.runpytest("--gdncheck-impl", "myport:factory", "-k", "error-head-ratio", "--collect-only", "-q")
    assert ids_of(result) == [c for c in CASES if "error-head-ratio" in c]


def test_a_failure_is_verify_short_text(port):
    case = next(c for c in CASES if c.startswith("decode_"))
    result = port.runpytest("--gdncheck-impl", MUTANT, "--gdncheck-profile", "f32", "-k", case)
    result.assert_outcomes(failed=1, deselected=len(CASES) - 1)
    text = result.stdout.str()
    assert f"FAIL  {case}: first divergence call 0, stage input_norm, tensor x_norm, token 0" in text
    assert "repro: gdncheck run " + MUTANT in text and f"--case {case}" in text
    # the whole failure is those three lines: no repr of gdncheck's objects, no traceback
    assert "CaseReport(" not in text and "Traceback" not in text and "runtest" not in text


def test_stage_isolated_and_explicit_fixtures(port, tmp_path):
    case = next(c for c in CASES if c.startswith("prefill_T1_"))
    result = port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-fixtures", str(DEFAULT_DIR),
                            "--gdncheck-stage-isolated", "--gdncheck-out", str(tmp_path / "out"), "-k", case)
    result.assert_outcomes(passed=1, deselected=len(CASES) - 1)
    meta = (tmp_path / "out" / f"{case}.safetensors").read_bytes()
    assert b'"mode":"stage_isolated"' in meta.replace(b" ", b"")


def test_properties_are_collectable(port):
    result = port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-properties", "-m", "gdncheck_property",
                            "--collect-only", "-q")
    assert ids_of(result) == sorted(PROPERTIES)
    name = "beta_zero_decays_only"
    result = port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-properties", "--gdncheck-max-examples",
                            "2", "-m", "gdncheck_property", "-k", name)
    result.assert_outcomes(passed=1, deselected=len(CASES) + len(PROPERTIES) - 1)


def test_a_bad_impl_is_one_usage_error(port):
    result = port.runpytest("--gdncheck-impl", "nosuchport:factory")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "cannot import module 'nosuchport'" in result.stderr.str()


def test_without_the_option_nothing_is_added(port):
    port.makepyfile(test_own="def test_own():\n    assert 1 + 1 == 2\n")
    result = port.runpytest("-q")
    result.assert_outcomes(passed=1)


def test_assert_conforms(tmp_path, monkeypatch):
    case = next(c for c in CASES if c.startswith("decode_"))
    summary = assert_conforms("reference", "bf16", cases=[case])
    assert [c.status for c in summary.cases] == ["pass"]
    with pytest.raises(NonConformance) as info:
        assert_conforms(MUTANT, "f32", cases=[case], out=tmp_path / "out")
    text = str(info.value)
    assert text.splitlines()[0].endswith("1 of 1 case(s) fail, 0 unusable")
    assert f"FAIL  {case}: first divergence call 0, stage input_norm" in text
    assert info.value.summary.exit_code == 1 and (tmp_path / "out" / f"{case}.safetensors").is_file()


NEVER = """
from gdncheck.harness import NotApplicable

def factory(cfg, weights, *, profile, strict=False, **options):
    raise NotApplicable("this port implements nothing")
"""


def test_a_session_that_judged_nothing_of_the_port_is_an_error(pytester):
    """Issue 26: narrowed to config-error cases, a port that declares everything not applicable 'passed'
    them, gdncheck's own parser having answered before the port was called. The session now fails,
    saying so; with one case that judged the port it passes."""
    pytester.makepyfile(never=NEVER, myport=PORT)
    result = pytester.runpytest("--gdncheck-impl", "never:factory", "--gdncheck-profile", "f32", "-p",
                                "no:cacheprovider", "-k", "error-head-ratio or error-invalid-eps")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*gdncheck: nothing of the port was judged: of 2 case test(s), 2 were answered "
                                 "by gdncheck's own config parser*"])
    ok = pytester.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-profile", "f32", "-p",
                            "no:cacheprovider", "-k", "error-head-ratio or prefill_T1_")
    assert ok.ret == pytest.ExitCode.OK, ok.stdout.str()


def test_known_failures_never_make_a_session_of_nothing_pass(pytester):
    """Issue 37: a port declaring every case not applicable, with one plausible 'not implemented' entry
    per required case, was 'xfailed' to exit 0. A known failure never excuses a case the coverage rule
    fails (declared not applicable, though every port must run it), and a session in which no tensor of
    the port was shown to conform fails."""
    pytester.makepyfile(never=NEVER)
    pytester.path.joinpath("xfails.txt").write_text(
        "never:factory f32 prefill_T1_ *  # not implemented yet\n"
        "never:factory f32 decode_T12 *  # not implemented yet\n")
    result = pytester.runpytest("--gdncheck-impl", "never:factory", "--gdncheck-profile", "f32", "-p",
                                "no:cacheprovider", "--gdncheck-xfails", "xfails.txt", "--gdncheck-diagnose", "0",
                                "-k", "prefill_T1_ or decode_T12_Hk2_Hv4")  # not snapshot-decode_T12_Hk2_Hv6
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.assert_outcomes(failed=2, deselected=len(CASES) - 2)
    assert "does not excuse this case: it declared not applicable a case every port must run" in result.stdout.str()


def test_a_session_of_only_known_failures_fails(pytester):
    pytester.makepyfile(raising="def factory(cfg, weights, *, profile, strict=False, **options):\n"
                                "    raise NotImplementedError('not implemented yet')\n")
    pytester.path.joinpath("xfails.txt").write_text("* * prefill_T1_ *  # not implemented yet\n")
    result = pytester.runpytest("--gdncheck-impl", "raising:factory", "--gdncheck-profile", "f32", "-p",
                                "no:cacheprovider", "--gdncheck-xfails", "xfails.txt", "--gdncheck-diagnose", "0",
                                "-k", "prefill_T1_")
    result.assert_outcomes(xfailed=1, deselected=len(CASES) - 1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*gdncheck: no tensor of the port was judged to conform: of 1 case test(s), 1 known*"])


def test_outputs_inside_the_suite_and_a_negative_diagnose_are_usage_errors(pytester):
    suite = pytester.path / "suite"
    suite.mkdir()
    suite.joinpath("manifest.json").write_text((DEFAULT_DIR / "manifest.json").read_text())
    pytester.makepyfile(myport=PORT)
    result = pytester.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-fixtures", str(suite),
                                "--gdncheck-out", str(suite / "out"), "-p", "no:cacheprovider", "-k", "prefill_T1_")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    err = [line for line in result.errlines if line.strip()]
    assert len(err) == 1 and "lies inside" in err[0] and "a fixture suite" in err[0], result.errlines
    assert not (suite / "out").exists() and sorted(p.name for p in suite.iterdir()) == ["manifest.json"]
    result = pytester.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-diagnose", "-1", "-p",
                                "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "expected a number of cases (0 or more), found '-1'" in result.stderr.str()


def test_entries_that_match_no_case_are_a_header_warning(port):
    port.path.joinpath("xfails.txt").write_text("* f32 decod_T12 *  # a typo\n"
                                                "* bf16 prefill_T1_ *  # another profile\n")
    result = port.runpytest("--gdncheck-impl", "myport:factory", "--gdncheck-profile", "f32", "--gdncheck-xfails",
                            "xfails.txt", "--collect-only", "-p", "no:cacheprovider")  # not -q: the header
    assert result.ret == 0
    result.stdout.fnmatch_lines(["gdncheck: warning: 2 known-failure entry(ies) match no case of this run*xfails.txt:1 "
                                 "(no case of the suite starts with 'decod_T12')*xfails.txt:2 (profile bf16; this "
                                 "run's: f32)*"])
