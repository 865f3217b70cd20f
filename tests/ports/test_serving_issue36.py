"""The issue-36 serving cases catch the bugs they exist for (run + verify, no properties): a commit that
caps the accepted count at 4 (spec-prefix-cache's windows are 8), a commit snapshot one draft token
late, a mixed call that writes its verify rows' slots before their commit, and one that keeps states
by row index instead of the row's slot. Each is the float64 reference's serving module with one
function replaced, run as a plug-in port; the correct module passes the same cases."""

from __future__ import annotations

import types

import numpy as np
import pytest

from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.build import build_suite
from gdncheck.harness import LayerAdapter
from gdncheck.reference import Layer
from gdncheck.reference import serving as RS
from gdncheck.snapshot import Snapshot

RECIPES = ("mixed-batch", "spec-prefix-cache")


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("issue36-fixtures")
    build_suite("serving", out, names=list(RECIPES))
    return out


def _port(**replaced):
    serving = types.SimpleNamespace(**{name: getattr(RS, name) for name in
                                       ("forward_packed", "prefix_snapshots", "verify_spec", "commit",
                                        "forward_mixed")})
    for name, fn in replaced.items():
        setattr(serving, name, fn)

    def factory(cfg, weights, *, profile="f64", strict=False, **_):
        return LayerAdapter(Layer(cfg, weights, strict=strict), "issue-36 port", load_snapshot=Snapshot.load,
                            serving=serving)
    return factory


def _judge(suite_dir, tmp_path, recipe, **replaced):
    cases = [recipe]
    run_impl(_port(**replaced), suite_dir, tmp_path, "f64", cases=cases)
    return verify(suite_dir, tmp_path, "f32", cases=cases).cases[0]


def _capped_commit(spec, accepted, *snaps):
    RS.commit(spec, np.minimum(np.asarray(accepted), 4), *snaps)


def _late_commit_snapshot(spec, accepted, snap_seq=(), snap_offset=(), snap_slot=()):
    late = np.minimum(np.asarray(snap_offset, dtype=np.int64) + 1, np.asarray(accepted)[np.asarray(snap_seq,
                                                                                                 dtype=np.int64)])
    RS.commit(spec, accepted, snap_seq, late, snap_slot)


def _mixed_writes_verify_rows(layer, pool, x, cu, pos, slots, verify):
    """The verify rows' final states written to their slots at the call, before any commit."""
    out, trace, spec = RS.forward_mixed(layer, pool, x, cu, pos, slots, verify)
    for i, v in enumerate(verify):
        if v and slots[i] != -1:
            row = int(cu[i + 1] - 1)
            pool.conv_state[slots[i]] = spec.conv_state_steps[row]
            pool.recurrent_state[slots[i]] = spec.recurrent_state_steps[row]
    return out, trace, spec


def _mixed_by_row_index(layer, pool, x, cu, pos, slots, verify):
    """States read and written by the row's index in the call, not its slot (padding kept)."""
    index = np.where(np.asarray(slots) == -1, -1, np.arange(len(slots)))
    return RS.forward_mixed(layer, pool, x, cu, pos, index, verify)


def test_the_reference_module_passes_both(suite_dir, tmp_path):
    for recipe in RECIPES:
        assert _judge(suite_dir, tmp_path / recipe, recipe).status == "pass", recipe


@pytest.mark.parametrize("recipe, replaced, step_op", [
    ("spec-prefix-cache", dict(commit=_capped_commit), "commit"),
    ("spec-prefix-cache", dict(commit=_late_commit_snapshot), "commit"),
    ("mixed-batch", dict(commit=_capped_commit), None),  # windows of at most 4: a cap at 4 passes here
    # its rows' slots are 0-3, so the commit's snapshot into slot 2 is refused (duplicate_slot): the run
    # ends there, raised
    ("mixed-batch", dict(forward_mixed=_mixed_by_row_index), "commit"),
    ("mixed-batch", dict(forward_mixed=_mixed_writes_verify_rows), "forward_mixed"),
])
def test_the_bug_fails_at_its_step(suite_dir, tmp_path, recipe, replaced, step_op):
    case = _judge(suite_dir, tmp_path, recipe, **replaced)
    if step_op is None:
        assert case.status == "pass"
        return
    assert case.status == "fail", case.message
    assert case.first_divergence.op == step_op, case.message
