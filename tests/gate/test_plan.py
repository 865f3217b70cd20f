"""Selection of the gate: shards partition cases and property units and agree with verify's
--shard; the interpreter skip; known failures (parsing, covering, stale entries)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gdncheck.cli import build_parser
from gdncheck.errors import GDNError
from gdncheck.fixtures.manifest import DEFAULT_DIR, load_manifest, select_cases
from gdncheck.gate.plan import INTERPRETER_MAX_CALLS, call_count, plan_cases, plan_properties
from gdncheck.gate.xfails import DEFAULT_PATH, classify, load_xfails

PROFILES = ["f32", "bf16", "f16"]


def test_shards_partition_cases_like_verify():
    m = load_manifest(DEFAULT_DIR)
    seen = []
    for i in range(3):
        entries, units, skipped, _ = plan_cases(m, PROFILES, shard=(i, 3))
        assert [e["id"] for e in entries] == [e["id"] for e in select_cases(m, shard=(i, 3))]
        assert len(units) == 3 * len(entries) and not skipped
        seen += [e["id"] for e in entries]
    assert sorted(seen) == sorted(c["id"] for c in m["cases"])


def test_shards_partition_property_units():
    names = ["a", "b", "c", "d"]
    full = plan_properties(names, PROFILES, None, {"d"})
    assert len(full) == 3 * 3 + 1
    parts = [u for i in range(4) for u in plan_properties(names, PROFILES, (i, 4), {"d"})]
    assert sorted(parts, key=repr) == sorted(full, key=repr)


def test_interpreter_skips_only_long_cases():
    """Only the long decodes of over 1000 layer calls are skipped on the interpreter (the 2048-token
    decode and the two 1001-call depth variants); the real-size long decode (193 calls) runs, and each
    reason says the skipped case's own number of calls."""
    m = load_manifest(DEFAULT_DIR)
    entries, _, skipped, selected = plan_cases(m, PROFILES, interpreter=True)
    long = [c["id"] for c in m["cases"] if "long" in c["tags"]]
    # long-decode, its real-size form (d128-long-decode) and the depth variants long-decode-gva2, -mha
    assert len(long) == 4
    over = [c["id"] for c in m["cases"] if "long" in c["tags"] and call_count(c) > INTERPRETER_MAX_CALLS]
    assert over == [i for i in long if not i.startswith("d128-")] and len(over) == 3
    assert selected == len(m["cases"]) and len(entries) == selected - len(over)
    assert [s.case for s in skipped] == over
    assert "2049 layer calls take about 3.4 minutes" in skipped[0].reason
    assert all("1001 layer calls take about 1.7 minutes" in s.reason for s in skipped[1:])
    entries, _, skipped, _ = plan_cases(m, PROFILES, interpreter=True, all_cases=True)
    assert not skipped and len(entries) == len(m["cases"])


def _report(case, status, tensors=()):
    return SimpleNamespace(id=case, status=status, records=[SimpleNamespace(tensor=t, verdict="fail") for t in tensors])


def test_known_failures(tmp_path):
    assert isinstance(load_xfails(DEFAULT_PATH), list)  # the packaged file parses (today it has no entries)
    f = tmp_path / "x.txt"
    f.write_text("# comment\ntriton f32 case-a core,out  # why\n* * case-b *  # all of it\n")
    xs = load_xfails(f)
    covered, stale = classify(xs, "triton", "f32", [_report("case-a_s0", "fail", ["core"]),
                                                     _report("case-b_s0", "pass")])
    assert set(covered) == {"case-a_s0"} and [x.case for x in stale] == ["case-b"]
    covered, stale = classify(xs, "triton", "f32", [_report("case-a_s0", "fail", ["core", "h"])])
    assert not covered and not stale  # fails beyond the entry: a real failure, not stale
    covered, _ = classify(xs, "reference", "f32", [_report("case-a_s0", "fail", ["core"])])
    assert not covered
    f.write_text("triton f32 case-a core\n")
    with pytest.raises(GDNError, match="needs its reason"):
        load_xfails(f)


def test_cli_parses_gate_options():
    args = build_parser().parse_args(["gate", "--profiles", "f32,bf16", "--shard", "1/4", "--device", "cuda",
                                      "--junit", "j.xml", "--report", "r", "--max-examples", "3", "-q"])
    assert args.profiles == ("f32", "bf16") and args.shard == "1/4" and args.quiet
