"""A commit's failure says, per slot, whether it is the commit's own or a snapshot destination, whether
it was written at all, and what it holds instead (issue 42 item 5): "left unchanged, but this step
should write it", the words of the HTML report, and "slot 4 holds the state after 4 draft token(s) of
sequence 2; the step asked for ... 8"."""

from __future__ import annotations

from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.meta import kill_matrix
from gdncheck.conformance.meta.catalogue import mutant_diagnoser
from gdncheck.conformance.meta.serving_mutants import SERVING_MUTANT_BY_NAME


def _commit_message(fixtures_dir, tmp_path, mutant, case, diagnose=None):
    kill_matrix.kill(SERVING_MUTANT_BY_NAME[mutant], "f32", fixtures_dir, out_dir=tmp_path, cases=[case])
    report = verify(fixtures_dir, tmp_path, "f32", cases=[case], diagnose=diagnose).cases[0]
    return report, report.message


def test_a_capped_commit_says_what_the_slot_holds(fixtures_dir, tmp_path):
    # spec-prefix-cache's commit accepts 8 draft tokens of sequence 2 into slot 4 and snapshots its
    # state after 4 into slot 9; a commit capped at 4 leaves slot 4 with the state after 4
    report, msg = _commit_message(fixtures_dir, tmp_path, "commit_capped_4", "spec-prefix-cache",
                                  diagnose=mutant_diagnoser(fixtures_dir, limit=1))
    assert "slot 4 (this commit's own): written wrong" in msg, msg
    said = ("slot 4 holds the state after 4 draft token(s) of sequence 2 (the golden of slot 9); the step asked "
            "for the state after 8 draft token(s) of sequence 2")
    assert said in msg, msg
    assert said in report.diagnosis["text"]  # the likely cause's symptoms say it too, before any class


def test_a_slot_the_commit_left_unchanged_is_said_so(fixtures_dir, tmp_path):
    # commit_off_by_one keeps n - 1 draft tokens: a sequence accepting 1 keeps 0, its slot unchanged
    _, msg = _commit_message(fixtures_dir, tmp_path, "commit_off_by_one", "spec-decode")
    assert "(this commit's own): left unchanged, but this step should write it" in msg, msg
