"""A mixed serving call and a commit with snapshots as verify and the report read them (issue 36): which
slots the step may write, what a row's tokens are called, and what the report says each row and slot
is for. The layouts are written out here, not taken from the code under test."""

from __future__ import annotations

from gdncheck.conformance.judge import packed
from gdncheck.reports import packed as report

# vLLM's order: a decode (slot 3), verify windows of 4 (slot 0) and 3 (slot 5), a prefill (slot 1), padding
MIXED = {"op": "forward_mixed", "call": 1, "cu_seqlens": [0, 1, 5, 8, 38, 40], "seq_pos": [20, 9, 12, 0, 0],
         "slots": [3, 0, 5, 1, -1], "verify": [0, 1, 1, 0, 0]}
COMMIT = {"op": "commit", "call": 2, "of_call": 1, "accepted": [0, 2, 3, 0, 0], "seq_pos": [20, 9, 12, 0, 0],
          "slots": [3, 0, 5, 1, -1], "verify": [0, 1, 1, 0, 0], "snap_seq": [1], "snap_offset": [1],
          "snap_slot": [2]}


def test_a_mixed_call_may_write_its_plain_rows_slots_only():
    assert packed.written_slots(MIXED) == {3, 1}


def test_a_commit_may_write_its_accepting_slots_and_its_snapshot_destinations():
    assert packed.written_slots(COMMIT) == {0, 5, 2}
    assert packed.written_slots({**COMMIT, "accepted": [0, 0, 3, 0, 0]}) == {5, 2}


def test_verify_rows_have_draft_tokens_and_plain_rows_tokens():
    assert [packed.token_word(MIXED, i) for i in range(5)] == ["token", "draft token", "draft token", "token",
                                                               "token"]
    assert packed.layout(0, MIXED)["verify"] == [0, 1, 1, 0, 0]


def test_the_report_says_what_each_row_and_slot_is_for():
    kinds = [r["kind"] for r in report.meanings(MIXED)]
    assert kinds == ["decode", "verify", "verify", "prefill", "prefill"]  # the padding row has 2 tokens
    roles = report.slot_roles(MIXED)
    assert "verify writes no slot" in roles[0] and "verify writes no slot" in roles[5]
    assert "read and written" in roles[3] and "read and written" in roles[1]
    rows = report.meanings(COMMIT)
    assert "nothing to commit" in rows[0]["what"] and "nothing to commit" in rows[3]["what"]
    assert rows[1]["what"].startswith("commit 2") and rows[2]["what"].startswith("commit 3")
    assert rows[-1]["kind"] == "snapshot" and "first 1 accepted tokens" in rows[-1]["what"]
    assert "1 snapshots" in report.step_label(COMMIT)
    assert report.slot_roles(COMMIT)[2] == "snapshot of sequence 1 at offset 1"


def test_a_mixed_case_renders_each_row_in_its_own_terms(tmp_path_factory):
    """The committed mixed-batch case run by the reference and shown in the report: each forward_mixed
    row as decode, prefill or verify with what the step does with its slot; the commit's plain rows with
    nothing to commit; the commit's snapshot."""
    from gdncheck.reports import write_report
    from tests.reports.conftest import serving_run
    from tests.reports.pages import parse
    from tests.reports.test_packed import program, sequence_rows

    case_id = "mixed-batch_T42_Hk2_Hv6_dk16_dv16_s0"
    run = serving_run(tmp_path_factory, "reference", [case_id])
    assert [c["status"] for c in run.doc["cases"]] == ["pass"]
    doc = parse(write_report(run.doc, tmp_path_factory.mktemp("mixed-report") / "site").parent / "cases"
                / f"{case_id}.html")
    steps = program(case_id)
    for i, st in enumerate(steps):
        if st["op"] == "forward_mixed":
            kinds = [r["kind"] for r in sequence_rows(doc, i)]
            lengths = [b - a for a, b in zip(st["cu_seqlens"], st["cu_seqlens"][1:])]
            assert kinds == ["verify" if v else ("decode" if n == 1 else "prefill")
                             for v, n in zip(st["verify"], lengths)], kinds
        if st["op"] == "commit" and st.get("snap_slot"):
            table = doc.find("table", id=f"layout-{i}").text
            assert "nothing to commit" in table and f"stored in slot {st['snap_slot'][0]}" in table
