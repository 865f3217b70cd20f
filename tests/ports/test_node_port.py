"""The dependency-free Node.js port (examples/ports/node/) runs every case from FORMAT.md alone (but the
sharded cases of format 1.3, which it declares not applicable from their shard step) and gdncheck verify
accepts it in profile f32, whether it sums like a GPU workgroup (64 strided partial
sums, then a tree: the default) or with one running float32 sum per dot product (GDN_NODE_LANES=1,
a naive kernel loop: the summation order the f32 tolerances were derived to admit, docs/tolerances.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gdncheck.conformance.judge.records import validate_summary
from gdncheck.conformance.judge.verify import verify

REPO = Path(__file__).resolve().parents[2]
RUN_JS = REPO / "examples" / "ports" / "node" / "run.js"
NODE = shutil.which("node")


def _sharded(manifest) -> set[str]:
    """The suite's sharded cases (format 1.3), which the Node template does not implement."""
    ids = {c["id"] for c in manifest["cases"] if "sharded" in c["requires"]}
    assert {i.split("_T")[0] for i in ids} == {"tp2", "tp4-past-keys", "tp3-uneven", "tp2-packed", "cp2-ragged",
                                               "cp4-ragged", "cp4-zigzag", "cp2-from-zero",
                                               "cp2-zigzag-from-zero", "tp2-cp2"}
    return ids


def _declares_sharded_not_applicable(s, sharded: set[str]) -> None:
    by = {c.id: c for c in s.cases}
    for cid in sorted(sharded):
        case = by[cid]
        assert case.status == "not_applicable", f"{cid}: {case.status} {case.message or case.problem}"
        assert case.not_applicable["reason"] == "requires sharded (format 1.3)"
        assert case.not_applicable["step"] == 1 and case.not_applicable["op"] == "shard"
        assert case.message.startswith("not applicable from step 1 (shard): requires sharded (format 1.3)")


@pytest.mark.skipif(NODE is None, reason="node (>= 20) is not on PATH; the Node.js port cannot run here")
@pytest.mark.parametrize("lanes", [None, "", "1"], ids=["lanes64", "empty-is-64", "lanes1"])
def test_node_port_conforms_in_f32(fixtures_dir, manifest, tmp_path, lanes):
    out = tmp_path / "node"
    env = {k: v for k, v in os.environ.items() if k != "GDN_NODE_LANES"}
    if lanes is not None:
        env["GDN_NODE_LANES"] = lanes
    proc = subprocess.run([NODE, str(RUN_JS), "--fixtures", str(fixtures_dir), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = verify(fixtures_dir, out, "f32")
    validate_summary(s.to_json())
    # the template implements no `sharded` (format 1.3): it declares those cases not applicable from the
    # shard step (FORMAT.md §4.2, §7.1), and runs every other case
    sharded = _sharded(manifest)
    _declares_sharded_not_applicable(s, sharded)
    bad = [f"{c.id}: {c.message or c.problem}" for c in s.cases if c.status != "pass" and c.id not in sharded]
    assert s.exit_code == 0 and not bad, "\n".join(bad)
    t = s.totals()
    assert t["passed"] == len(manifest["cases"]) - len(sharded) and t["records_missing"] == 0  # every stage tensor
    assert all(c.error_check["match"] == "exact" for c in s.cases if c.kind == "error")
    saved = [r for c in s.cases for r in c.records if r.op == "save"]
    assert saved and all(r.verdict == "pass" for r in saved)  # its snapshot files, read back by verify
    assert s.implementation["name"] == "node-f32 (examples/ports/node)"


@pytest.mark.skipif(NODE is None, reason="node (>= 20) is not on PATH; the Node.js port cannot run here")
@pytest.mark.parametrize("lanes", ["0", "abc", "2.5"])
def test_node_port_refuses_a_bad_lane_count(fixtures_dir, tmp_path, lanes):
    """A typo in GDN_NODE_LANES stops the port with what was expected and found, before any case runs
    (Number('') was 0 lanes once: every reduction summed nothing, and 17 of 29 cases failed)."""
    env = {**os.environ, "GDN_NODE_LANES": lanes}
    proc = subprocess.run([NODE, str(RUN_JS), "--fixtures", str(fixtures_dir), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode != 0
    assert f'GDN_NODE_LANES: expected a positive integer (partial sums per reduction), found "{lanes}"' in proc.stderr
    assert not list(tmp_path.glob("o/*.safetensors"))  # no case ran


@pytest.mark.skipif(NODE is None, reason="node (>= 20) is not on PATH; the Node.js port cannot run here")
def test_node_port_runs_the_serving_cases(tmp_path):
    """Packed calls over pool slots, verify + commit and prefix snapshots (FORMAT.md §4.1), every stage
    tensor and the whole pool after each step, in f32; and the seven serving error cases refused with
    their codes (a slot outside the pool, named twice, an empty sequence, a bad accept count or snapshot
    request, freeing the padding id or a slot out of range)."""
    from gdncheck.fixtures.build import build_suite

    fixtures = tmp_path / "serving"
    build_suite("serving", fixtures)
    out = tmp_path / "node"
    proc = subprocess.run([NODE, str(RUN_JS), "--fixtures", str(fixtures), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = verify(fixtures, out, "f32")
    bad = [f"{c.id}: {c.message or c.problem}" for c in s.cases if c.status != "pass"]
    assert s.exit_code == 0 and not bad, "\n".join(bad)
    t = s.totals()
    assert t["passed"] == 13 and t["records_missing"] == 0  # with issue 36's mixed-batch, spec-prefix-cache
    refused = {c.id.split("_")[0] for c in s.cases if "error" in c.tags}
    assert refused == {"error-free-padding", "error-free-out-of-range", "error-slot-index", "error-duplicate-slot",
                       "error-empty-sequence", "error-accept-count", "error-snapshot-request"}
    assert {r.op for c in s.cases for r in c.records} >= {"forward_packed", "prefix_snapshots", "verify_spec", "commit",
                                                         "forward_mixed"}


@pytest.mark.skipif(NODE is None, reason="node (>= 20) is not on PATH; the Node.js port cannot run here")
def test_node_port_written_for_an_older_format_declares_what_it_lacks(fixtures_dir, manifest, tmp_path):
    """GDN_NODE_FEATURES=1.1: the runner as written for fixture format 1.1 (no commit snapshots). The two
    cases whose commit keeps snapshots are not applicable from that commit, with the feature and its
    version named (FORMAT.md §2 requires, §7); the sharded cases (format 1.3) are not applicable from their
    shard step, as for the template of any version; every other case conforms, and the run conforms."""
    out = tmp_path / "node11"
    env = {**os.environ, "GDN_NODE_FEATURES": "1.1"}
    proc = subprocess.run([NODE, str(RUN_JS), "--fixtures", str(fixtures_dir), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = verify(fixtures_dir, out, "f32")
    validate_summary(s.to_json())
    sharded = _sharded(manifest)  # format 1.3: not applicable for the template as written for any version
    _declares_sharded_not_applicable(s, sharded)
    na = {c.id.split("_T")[0]: c for c in s.cases if c.status == "not_applicable" and c.id not in sharded}
    newer = {c["id"].split("_T")[0] for c in manifest["cases"] if "commit_snapshots" in c["requires"]}
    assert set(na) == newer == {"mixed-batch", "spec-prefix-cache"}
    for case in na.values():
        assert case.not_applicable["reason"] == "requires commit_snapshots (format 1.2)"
        assert case.not_applicable["step"] == 3 and case.not_applicable["op"] == "commit"
        assert case.message.startswith("not applicable from step 3 (commit): requires commit_snapshots (format 1.2)")
        assert any(r.verdict == "pass" for r in case.records)  # the calls before the commit are judged
    bad = [f"{c.id}: {c.message or c.problem}" for c in s.cases if c.status not in ("pass", "not_applicable")]
    assert s.exit_code == 0 and not bad, "\n".join(bad)
    assert s.totals()["passed"] == len(manifest["cases"]) - 2 - len(sharded)


@pytest.mark.skipif(NODE is None, reason="node (>= 20) is not on PATH; the Node.js port cannot run here")
@pytest.mark.parametrize("features, reason, step", [
    ("1.0", "requires mixed_batches (format 1.1), commit_snapshots (format 1.2)", 2),
    ("packed_calls,spec_decode,mixed_batches", "requires commit_snapshots (format 1.2)", 3),
])
def test_node_port_names_every_feature_it_lacks(fixtures_dir, tmp_path, features, reason, step):
    out = tmp_path / "node"
    env = {**os.environ, "GDN_NODE_FEATURES": features}
    proc = subprocess.run([NODE, str(RUN_JS), "--fixtures", str(fixtures_dir), "--out", str(out), "--case",
                           "mixed-batch", "--case", "packed-mixed"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = verify(fixtures_dir, out, "f32")
    by = {c.id.split("_T")[0]: c for c in s.cases}
    assert by["mixed-batch"].status == "not_applicable" and by["packed-mixed"].status == "pass"
    assert by["mixed-batch"].not_applicable["reason"] == reason and by["mixed-batch"].not_applicable["step"] == step


@pytest.mark.skipif(NODE is None, reason="node (>= 20) is not on PATH; the Node.js port cannot run here")
def test_node_port_reads_an_older_manifest_by_the_fields_it_knows(fixture_copy, tmp_path):
    """A manifest of version 1 has no requires: the runner goes by the fields it reads, and a commit
    carrying snap_* is still not applicable for a runner written for 1.1, never run with them ignored."""
    path = fixture_copy / "manifest.json"
    doc = json.loads(path.read_text())
    doc["format_version"] = 1
    del doc["features"]
    for c in doc["cases"]:
        del c["requires"]
    path.write_text(json.dumps(doc))
    out = tmp_path / "node"
    env = {**os.environ, "GDN_NODE_FEATURES": "1.1"}
    proc = subprocess.run([NODE, str(RUN_JS), "--fixtures", str(fixture_copy), "--out", str(out), "--case",
                           "spec-prefix-cache"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not applicable from step 3: requires commit_snapshots (format 1.2)" in proc.stdout
    (case,) = verify(fixture_copy, out, "f32", cases=["spec-prefix-cache"]).cases
    assert case.status == "not_applicable"


@pytest.mark.skipif(NODE is None, reason="node (>= 20) is not on PATH; the Node.js port cannot run here")
@pytest.mark.parametrize("features", ["0.9", "1.3", "commit_snapshot", "moe,2"])
def test_node_port_refuses_a_feature_set_it_cannot_be(fixtures_dir, tmp_path, features):
    env = {**os.environ, "GDN_NODE_FEATURES": features}
    proc = subprocess.run([NODE, str(RUN_JS), "--fixtures", str(fixtures_dir), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode != 0 and "GDN_NODE_FEATURES: expected a" in proc.stderr
    assert not list(tmp_path.glob("o/*.safetensors"))  # no case ran


@pytest.mark.skipif(NODE is None, reason="node (>= 20) is not on PATH; the Node.js port cannot run here")
@pytest.mark.parametrize("dest, code", [(3, "duplicate_slot"), (0, "duplicate_slot"), (6, "slot_index")])
def test_node_port_refuses_a_commit_snapshot_into_a_slot_of_the_committed_call(fixture_copy, tmp_path, dest, code):
    """FORMAT.md §4.1, docs/serving.md §3-4 (issue 42 item 6): a commit's snapshot destination is never a slot
    of the call it commits, a plain row's (slot 3: the decode row of mixed-batch's first mixed call) as much
    as a verify row's (slot 0), and lies in the pool (6 slots), as the reference refuses it."""
    path = fixture_copy / "manifest.json"
    doc = json.loads(path.read_text())
    case = next(c for c in doc["cases"] if c["id"].startswith("mixed-batch_T"))
    commit = case["program"][3]
    assert commit["op"] == "commit" and commit["slots"][0] == 3 and commit["verify"][0] == 0
    commit["snap_slot"] = [dest]
    path.write_text(json.dumps(doc))
    proc = subprocess.run([NODE, str(RUN_JS), "--fixtures", str(fixture_copy), "--out", str(tmp_path / "o"),
                           "--case", "mixed-batch"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{code} at step 3: request 0: destination slot {dest}" in proc.stdout, proc.stdout
