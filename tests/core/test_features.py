"""The fixture format's features and versions (gdncheck/features.py, FORMAT.md §2, §10, Changelog):
versions read and refused, ``requires`` computed from hand-built programs, the reason a runner gives,
and the step fields it knows agreeing with the manifest schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gdncheck import features as F

SCHEMA = Path(__file__).resolve().parents[2] / "fixtures" / "manifest.schema.json"


@pytest.mark.parametrize("value, want", [(1, (1, 0)), ("1", (1, 0)), ("1.0", (1, 0)), ("1.2", (1, 2)),
                                         ("1.17", (1, 17))])
def test_versions_read(value, want):
    assert F.parse_version(value) == want
    assert F.check_readable(value) == want  # a newer minor too: read case by case


@pytest.mark.parametrize("value", [True, 1.2, "1.", "v1.2", "1.2.3", None, [1, 2], " 1.2", 2.0])
def test_no_version_is_refused_in_one_line(value):
    with pytest.raises(F.FormatVersionError) as exc:
        F.parse_version(value)
    assert "expected format_version a version" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("value", [2, "2.0", "0.9"])
def test_another_major_is_refused_saying_so(value):
    with pytest.raises(F.FormatVersionError, match="of major version 1 .* found .*another major"):
        F.check_readable(value)


def test_the_current_version_is_the_newest_feature_version():
    newest = max(F.parse_version(f.since) for f in F.FEATURES.values())
    assert F.version_text(newest) == F.FORMAT_VERSION == "1.3"
    assert set(F.COVERAGE_OF) == set(F.FEATURES)


CONSTRUCT = {"op": "construct", "strict": False, "pool_size": 4}
PACKED = {"op": "forward_packed", "call": 0, "T": 3, "cu_seqlens": [0, 3], "seq_pos": [0], "slots": [0],
          "requests": [0], "tokens": [[0, 3]], "seq_len_after": [3, 0, 0, 0], "expected": ["out"]}
MIXED = {**PACKED, "op": "forward_mixed", "call": 1, "verify": [1]}
COMMIT = {"op": "commit", "call": 2, "of_call": 1, "accepted": [2], "seq_pos": [3], "slots": [0], "T": 0,
          "seq_len_after": [5, 0, 0, 0], "expected": [], "verify": [1]}
SNAPS = {"snap_seq": [0], "snap_offset": [1], "snap_slot": [2]}


def test_requires_names_each_feature_at_the_first_step_that_needs_it():
    program = [CONSTRUCT, PACKED, MIXED, {**COMMIT, **SNAPS}]
    assert F.case_requires({}, program) == {"packed_calls": 0, "spec_decode": 2, "mixed_batches": 2,
                                            "commit_snapshots": 3}
    # the same commit without its snapshot requests needs no commit_snapshots; a verify_spec no mixed_batches
    plain_commit = {k: v for k, v in COMMIT.items() if k != "verify"}
    program = [CONSTRUCT, PACKED, {**PACKED, "op": "verify_spec", "call": 1}, plain_commit]
    assert F.case_requires({}, program) == {"packed_calls": 0, "spec_decode": 2}


def test_requires_of_the_dense_core_is_empty_and_of_strict_moe_and_files_is_named():
    dense = [{"op": "construct", "strict": False}, {"op": "forward", "call": 0}, {"op": "snapshot", "slot": "a",
                                                                               "state_of_call": 0}]
    assert F.case_requires({"hidden_size": 8}, dense) == {}
    files = [{"op": "construct", "strict": True}, {"op": "forward", "call": 0},
             {"op": "snapshot", "slot": "a", "state_of_call": 0}, {"op": "save", "slot": "a", "file": "s",
                                                                   "state_of_call": 0}]
    assert F.case_requires({"num_experts": 4}, files) == {"snapshot_files": 3, "strict_mode": 0, "moe": 0}


def test_the_reason_a_runner_gives_names_the_feature_and_its_version():
    assert F.not_applicable_reason(["commit_snapshots"]) == "requires commit_snapshots (format 1.2)"
    assert (F.not_applicable_reason(["mixed_batches", "commit_snapshots"])
            == "requires mixed_batches (format 1.1), commit_snapshots (format 1.2)")
    # a feature of a newer suite: its version from the manifest's features table
    assert (F.not_applicable_reason(["sharded_calls"], {"sharded_calls": {"since": "1.3", "what": "x"}})
            == "requires sharded_calls (format 1.3)")


def test_features_up_to_a_version_and_those_added_since():
    assert F.features_up_to("1.2") == set(F.FEATURES) - {"sharded"}
    assert F.features_up_to("1.1") == set(F.FEATURES) - {"commit_snapshots", "sharded"}
    assert F.features_up_to(1) == set(F.FEATURES) - {"commit_snapshots", "mixed_batches", "sharded"}
    req = {"packed_calls": 0, "spec_decode": 2, "mixed_batches": 2, "commit_snapshots": 3}
    assert F.added_since("1.0", req) == [("mixed_batches", "1.1"), ("commit_snapshots", "1.2")]
    assert F.added_since("1.2", req) == [] and F.added_since("junk", req) == []
    note = F.since_note("1.1", req)
    assert "written for fixture format 1.1" in note and "commit_snapshots (format 1.2), added since" in note


def test_a_declared_feature_set_naming_no_feature_is_refused():
    assert F.check_declared(["moe", "packed_calls"], "f") == {"moe", "packed_calls"}
    with pytest.raises(F.FeatureError, match="found 'comit_snapshots'"):
        F.check_declared({"comit_snapshots"}, "f")
    with pytest.raises(F.FeatureError, match="a collection of feature names"):
        F.check_declared("moe", "f")


def test_requires_problems_a_reader_refuses():
    program = [CONSTRUCT, PACKED, MIXED, {**COMMIT, **SNAPS}]
    good = {"config": {}, "program": program, "requires": F.case_requires({}, program)}
    table = F.table()
    assert F.requires_problem(good, table, "0.0") is None
    hidden = {**good, "requires": {k: v for k, v in good["requires"].items() if k != "commit_snapshots"}}
    assert "but its program and config need" in F.requires_problem(hidden, table, "0.0")
    newer = {**good, "requires": {**good["requires"], "sharded_calls": 1}}
    msg = F.requires_problem(newer, {**table, "sharded_calls": {"since": "1.3", "what": "x"}}, "0.0")
    assert "'sharded_calls' (format 1.3" in msg and "this suite is newer" in msg and "upgrade gdncheck" in msg
    extra = {**good, "program": [*program[:3], {**COMMIT, **SNAPS, "snap_kind": [0]}]}
    assert "step 3 (commit) carries field(s) 'snap_kind'" in F.requires_problem(extra, table, "0.0")
    assert "is op 'shard_calls'" in F.requires_problem({**good, "program": [*program, {"op": "shard_calls"}]}, table,
                                                       "0.0")


def test_the_fields_each_op_knows_are_the_schemas():
    """OP_FIELDS (what a reader of this version runs) and the manifest schema's steps name the same fields."""
    steps = json.loads(SCHEMA.read_text())["$defs"]["step"]["oneOf"]
    schema_fields: dict[str, set[str]] = {}
    for alt in steps:
        op = alt["properties"]["op"]
        for name in op.get("enum", [op.get("const")]):
            schema_fields[name] = set(alt["properties"]) - {"op"}
    assert schema_fields == {op: set(fields) for op, fields in F.OP_FIELDS.items()}
    assert set(F.OP_FIELDS) == set(F.OP_FEATURES)
