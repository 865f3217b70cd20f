"""A serving case's manifest entry is checked before anything runs (fixtures/consistency.py, FORMAT.md
§4.1): each contradiction of the packed layout makes the entry unusable, naming the step and field."""

from __future__ import annotations

import copy
import json

import pytest

from gdncheck.fixtures.consistency import entry_problem


def _serving(fixtures_dir, recipe: str) -> dict:
    doc = json.loads((fixtures_dir / "manifest.json").read_text())
    return next(c for c in doc["cases"] if c["id"].split("_")[0] == recipe)


def _first(entry: dict, op: str) -> dict:
    return next(s for s in entry["program"] if s["op"] == op)


def test_the_committed_serving_cases_are_consistent(fixtures_dir):
    for recipe in ("packed-mixed", "packed-mismatch", "spec-decode", "prefix-cache"):
        assert entry_problem(_serving(fixtures_dir, recipe)) is None


def _set(op, field, value):
    def alter(e):
        _first(e, op)[field] = value(_first(e, op)) if callable(value) else value
    return alter


@pytest.mark.parametrize(("recipe", "alter", "words"), [
    ("packed-mixed", _set("forward_packed", "cu_seqlens", lambda s: [*s["cu_seqlens"][:-1], s["T"] + 1]),
     "cu_seqlens"),
    ("packed-mixed", _set("forward_packed", "cu_seqlens", lambda s: s["cu_seqlens"][::-1]), "cu_seqlens"),
    ("packed-mixed", _set("forward_packed", "seq_pos", lambda s: s["seq_pos"][:-1]), "seq_pos has"),
    ("packed-mixed", _set("forward_packed", "slots", lambda s: [99] * len(s["slots"])), "not slots of a pool"),
    ("packed-mixed", _set("forward_packed", "slots", lambda s: [s["slots"][0]] * len(s["slots"])), "twice"),
    ("packed-mixed", _set("forward_packed", "call", 7), "expected call 0"),
    ("packed-mixed", _set("forward_packed", "seq_len_after", [0]), "pool size"),
    ("packed-mixed", _set("construct", "pool_size", 99), "pool_size"),
    ("packed-mixed", _set("free", "slots", [-1]), "not slots of a pool"),
    ("spec-decode", _set("commit", "of_call", 99), "no verify_spec call"),
    ("spec-decode", _set("commit", "accepted", lambda s: [99] * len(s["accepted"])), "draft tokens"),
    ("prefix-cache", _set("prefix_snapshots", "snap_offset", lambda s: [10 ** 6] * len(s["snap_offset"])),
     "no prefix"),
    ("prefix-cache", _set("prefix_snapshots", "snap_slot", lambda s: s["snap_slot"][:-1]), "as many"),
])
def test_a_contradiction_of_the_packed_layout_is_named(fixtures_dir, recipe, alter, words):
    entry = copy.deepcopy(_serving(fixtures_dir, recipe))
    alter(entry)
    problem = entry_problem(entry)
    assert problem is not None and words in problem, problem
