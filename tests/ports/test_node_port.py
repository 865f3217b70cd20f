"""The dependency-free Node.js port (examples/ports/node/) runs every case from FORMAT.md alone and
gdncheck verify accepts it in profile f32, whether it sums like a GPU workgroup (64 strided partial
sums, then a tree: the default) or with one running float32 sum per dot product (GDN_NODE_LANES=1,
a naive kernel loop: the summation order the f32 tolerances were derived to admit, docs/tolerances.md)."""

from __future__ import annotations

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
    bad = [f"{c.id}: {c.message or c.problem}" for c in s.cases if c.status != "pass"]
    assert s.exit_code == 0 and not bad, "\n".join(bad)
    t = s.totals()
    assert t["passed"] == len(manifest["cases"]) and t["records_missing"] == 0  # every stage tensor, every case
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
