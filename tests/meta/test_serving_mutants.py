"""The serving patterns' bug classes (conformance/meta/serving_mutants.py, issue 14 item 7): each, run
like a port over the default suite's serving cases, is caught first at its own stage, by at least ten
times the bound, in every profile; the message locates it by sequence and token, or by slot."""

from __future__ import annotations

import pytest

from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.meta import kill_matrix
from gdncheck.conformance.meta.serving_mutants import SERVING_MUTANTS
from gdncheck.stages import stage_rank


@pytest.mark.parametrize("profile", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("mutant", SERVING_MUTANTS, ids=[m.name for m in SERVING_MUTANTS])
def test_serving_mutant_is_caught_at_its_stage_by_ten_times_the_bound(fixtures_dir, tmp_path, mutant, profile):
    r = kill_matrix.kill(mutant, profile, fixtures_dir, out_dir=tmp_path)
    assert r.killed and r.first_stage == mutant.stage, r
    s = verify(fixtures_dir, tmp_path, profile, cases=list(r.first_by_case) or None)
    ratios = [rec.metrics["max_err"] / rec.bound["elem"] for c in s.cases for rec in c.records
              if rec.verdict == "fail" and rec.metrics and rec.stage == mutant.stage]
    assert ratios and max(ratios) >= 10, (mutant.name, profile, ratios)
    earliest = [c for c in s.cases if c.first_divergence and c.first_divergence.stage == mutant.stage]
    assert all(stage_rank(c.first_divergence.stage) >= stage_rank(mutant.stage) for c in s.cases
               if c.first_divergence and c.first_divergence.stage)
    located = " ".join(c.message for c in earliest)
    assert "packed call: stream token" in located or "pool slots over the bound" in located, located


def test_the_kill_matrix_lists_the_serving_bug_classes():
    names = {m.name for m in kill_matrix.CATALOGUE}
    assert {m.name for m in SERVING_MUTANTS} <= names
    classes = {m.bug_class for m in SERVING_MUTANTS}
    assert {"conv window leaks across a packed boundary", "chunks straddle two sequences",
            "state read from slot i, written to j", "padding slot written", "commit off by one token",
            "prefix snapshot one chunk late", "commit one token late (n + 1 kept)",
            "commit's accepted count capped at 4", "stale conv state on a new request (state handling)",
            "mixed batch: plain rows' states not gathered (run from zeros)",
            *(f"a prefill of 1 + {k} tokens dispatched as a {k}-draft verify (slot not written)" for k in (1, 2, 3, 4))
            } == classes


@pytest.mark.parametrize("drafts", [1, 2, 3, 4])
def test_a_prefill_of_one_plus_the_draft_count_run_as_a_verify_fails_three_layouts(fixtures_dir, tmp_path, drafts):
    """vLLM issue 53051's class (issue 44 item 2): a sequence of exactly 1 + K tokens dispatched as a
    K-draft verify window leaves its slot unwritten; at least three serving cases of different head
    layouts hold such a call (the spec-windows cases: prefills of every length 1-6 beside verify
    windows of 1-4 drafts), each failing at conv1d, the slot's conv state (before them: 2 cases for
    K = 1, 3 and 4)."""
    from gdncheck.conformance.meta.serving_mutants import SERVING_MUTANT_BY_NAME
    from gdncheck.fixtures.manifest import load_manifest

    mutant = SERVING_MUTANT_BY_NAME[f"prefill_as_verify_{drafts}"]
    r = kill_matrix.kill(mutant, "f32", fixtures_dir, out_dir=tmp_path)
    configs = {c["id"]: c["config"] for c in load_manifest(fixtures_dir)["cases"]}
    layouts = {(configs[c]["linear_num_key_heads"], configs[c]["linear_num_value_heads"]) for c in r.first_by_case}
    assert len(r.first_by_case) >= 3 and len(layouts) >= 3, (sorted(r.first_by_case), layouts)
    # the slot's conv state, or its seq_len where a case keeps no conv state there (the real-size ones)
    assert all(fd.stage in ("conv1d", "state") for fd in r.first_by_case.values()), r.first_by_case
    windows = [c for c in r.first_by_case if c.startswith("spec-windows")]
    assert len(windows) == 3 and all(r.first_by_case[c].stage == "conv1d" for c in windows), sorted(r.first_by_case)


def test_a_slot_wrong_since_an_earlier_step_is_not_blamed_on_a_later_one(fixtures_dir, tmp_path):
    """commit_off_by_one spoils the slots its commit writes; the verify after it writes no slot and
    leaves them as they were: verify says they are carried, not touched by the verify."""
    from gdncheck.conformance.meta.serving_mutants import SERVING_MUTANT_BY_NAME
    from gdncheck.fixtures.manifest import load_manifest

    case = next(c for c in load_manifest(fixtures_dir)["cases"] if "spec-decode" in c.get("tags", []))
    r = kill_matrix.kill(SERVING_MUTANT_BY_NAME["commit_off_by_one"], "f32", fixtures_dir, out_dir=tmp_path)
    assert r.killed
    report = next(c for c in verify(fixtures_dir, tmp_path, "f32", cases=[case["id"]]).cases)
    program = case["program"]
    commit = next(i for i, s in enumerate(program) if s["op"] == "commit")
    after = next(i for i, s in enumerate(program) if s["op"] == "verify_spec" and i > commit)
    spoiled = sorted(s for s, n in zip(program[commit]["slots"], program[commit]["accepted"]) if s >= 0 and n > 0)
    msgs = [rec.message for rec in report.records if rec.step == after and rec.tensor == "conv_state"]
    assert msgs and f"slot(s) {spoiled} are left as they were: wrong since an earlier step" in msgs[0], msgs
    assert "touched a slot it must not" not in msgs[0]


def test_verify_names_a_serving_bug_as_the_likely_cause(fixtures_dir, tmp_path, capsys):
    """The diagnosis's catalogue holds the serving patterns' mutants: a port whose conv window leaks
    across a packed boundary is told so by `gdncheck verify` on the packed case (its outputs are that
    mutant's, so the match is exact), and the likely cause rides on the failing case's lines."""
    from gdncheck.cli import main
    from gdncheck.conformance.meta.catalogue import ALL_MUTANTS

    assert {m.name for m in SERVING_MUTANTS} <= {m.name for m in ALL_MUTANTS}
    out = tmp_path / "out"
    impl = "gdncheck.conformance.meta.serving_mutants:conv_window_leaks"
    assert main(["run", impl, "--fixtures", str(fixtures_dir), "--profile", "f32", "--case", "packed-mixed",
                 "--out", str(out), "-q"]) == 0
    capsys.readouterr()
    code = main(["verify", "--fixtures", str(fixtures_dir), "--outputs", str(out), "--profile", "f32",
                 "--case", "packed-mixed"])
    text = capsys.readouterr().out
    assert code == 1 and "FAIL  packed-mixed_" in text, text
    assert "likely cause: symptoms of " in text and "matches: conv window leaks across a packed boundary (residual " \
        in text, text


def test_a_commit_bug_is_named_a_state_handling_bug_not_a_conv_one(fixtures_dir, tmp_path, capsys):
    """Issue 36: a commit computes nothing, so the conv_state it leaves wrong (stage conv1d in the
    vocabulary) is grouped and printed as the commit's state handling."""
    from gdncheck.cli import main

    out = tmp_path / "out"
    impl = "gdncheck.conformance.meta.serving_mutants:commit_one_late"
    assert main(["run", impl, "--fixtures", str(fixtures_dir), "--profile", "f32", "--case", "spec-decode",
                 "--out", str(out), "-q"]) == 0
    capsys.readouterr()
    code = main(["verify", "--fixtures", str(fixtures_dir), "--outputs", str(out), "--profile", "f32",
                 "--case", "spec-decode", "--diagnose", "0"])
    text = capsys.readouterr().out
    assert code == 1
    assert "1 first diverge at state handling at commit/conv_state" in text, text
    assert "first diverge at conv1d" not in text, text
    assert "first divergence call 2 (commit), stage conv1d, tensor conv_state" in text, text
