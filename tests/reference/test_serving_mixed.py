"""Mixed serving batches and commits that keep accepted prefixes (docs/serving.md §4a, issue 36), on the
float64 reference, against their equivalent plain calls: a verify row of ``forward_mixed`` is a verify
(outputs of the plain call, its slot untouched until the commit), a plain row a packed call (its slot
written), and ``commit`` at every accepted count 0..8 of an 8-token window, with snapshots inside and at
the end of the accepted prefix, is the plain call of that many tokens."""

from __future__ import annotations

import numpy as np
import pytest

from gdncheck import errors as E
from gdncheck.calls import PAD_SLOT_ID
from gdncheck.reference import Layer, commit, forward_mixed, verify_spec
from gdncheck.synthetic import make_weights
from tests.helpers import rel_err
from tests.reference.test_serving import (
    CFG,
    assert_slot_equals,
    assert_slots_identical,
    busy_pool,
    copy_pool,
    packed,
    plain,
)

TOL = 1e-12


@pytest.fixture(scope="module")
def layer():
    return Layer(CFG, make_weights(CFG, seed=0))


def _mixed_call(layer, lengths, slots, verify, seed=3):
    pool = busy_pool(seed=seed)
    seq_pos = np.where(np.asarray(slots) == PAD_SLOT_ID, 0, pool.seq_len[np.maximum(slots, 0)])
    before = copy_pool(pool)
    x, cu, xs = packed(lengths, seed=seed)
    out, trace, spec = forward_mixed(layer, pool, x, cu, seq_pos, slots, verify)
    return pool, before, out, trace, spec, cu, xs, seq_pos


def test_a_mixed_call_is_a_verify_of_its_verify_rows_and_a_packed_call_of_the_others(layer):
    # vLLM's order: a decode, two verify windows, a prefill longer than a chunk, a padding row
    lengths, slots, verify = [1, 4, 8, 70, 2], [5, 1, 3, 0, PAD_SLOT_ID], [0, 1, 1, 0, 0]
    pool, before, out, trace, spec, cu, xs, pos = _mixed_call(layer, lengths, slots, verify)
    for i, (x_i, slot) in enumerate(zip(xs, slots)):
        want, want_trace, r = plain(layer, before, slot, x_i, pos[i])
        rows = slice(cu[i], cu[i + 1])
        assert rel_err(out[rows], want) <= TOL and rel_err(trace["core"][rows], want_trace["core"]) <= TOL, i
        if not verify[i] and slot != PAD_SLOT_ID:
            assert_slot_equals(pool, slot, r)  # a plain row writes its slot now
    # verify rows' slots (1, 3) and slots no row names are untouched until the commit
    assert_slots_identical(pool, before, [1, 2, 3, 4, 6, 7])
    # the commit: 3 of row 1's window, all 8 of row 2's; the plain rows take 0 and keep the call's state
    after_call = copy_pool(pool)
    commit(spec, [0, 3, 8, 0, 0])
    for i, n in ((1, 3), (2, 8)):
        _, _, r = plain(layer, before, slots[i], xs[i][:n], pos[i])
        assert_slot_equals(pool, slots[i], r)
    assert_slots_identical(pool, after_call, [0, 2, 4, 5, 6, 7])


def test_a_mixed_call_matches_the_separate_calls_an_engine_could_make(layer):
    """A mixed call = forward_packed of its plain rows + verify_spec of its verify rows (disjoint slots)."""
    lengths, slots, verify = [3, 1, 5], [2, 6, 4], [1, 0, 1]
    pool, before, out, _, spec, cu, xs, pos = _mixed_call(layer, lengths, slots, verify, seed=5)
    other = copy_pool(before)
    xv = np.concatenate([xs[0], xs[2]])
    out_v, _, spec_v = verify_spec(layer, other, xv, [0, 3, 8], [pos[0], pos[2]], [2, 4])
    assert rel_err(out[cu[2]:cu[3]], out_v[3:]) <= TOL
    np.testing.assert_allclose(spec.recurrent_state_steps[cu[2]:cu[3]], spec_v.recurrent_state_steps[3:],
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", range(9))
def test_commit_at_every_count_of_an_8_token_window(layer, n):
    pool, before, _, _, spec, _, xs, pos = _mixed_call(layer, [8, 2], [3, 7], [1, 0], seed=11)
    commit(spec, [n, 0])
    if n == 0:
        assert_slots_identical(pool, before, [3])
    else:
        _, _, r = plain(layer, before, 3, xs[0][:n], pos[0])
        assert_slot_equals(pool, 3, r)
        assert pool.seq_len[3] == pos[0] + n


def test_commit_snapshots_keep_states_inside_and_at_the_end_of_the_accepted_window(layer):
    pool, before, _, _, spec, _, xs, pos = _mixed_call(layer, [8, 8], [3, 7], [1, 1], seed=13)
    commit(spec, [5, 2], snap_seq=[0, 0, 1], snap_offset=[1, 5, 2], snap_slot=[0, 1, 2])
    for slot, (i, o) in zip((0, 1, 2), ((0, 1), (0, 5), (1, 2))):
        _, _, r = plain(layer, before, [3, 7][i], xs[i][:o], pos[i])
        assert_slot_equals(pool, slot, r)
        assert pool.seq_len[slot] == pos[i] + o
    assert_slots_identical(pool, before, [4, 5, 6])


@pytest.mark.parametrize("args, error, match", [
    (dict(verify=[1, 2]), E.InputShapeError, "flags 0 or 1"),
    (dict(verify=[1]), E.InputShapeError, "flags 0 or 1"),
    (dict(accepted=[1, 1]), E.AcceptCountError, "plain"),
    (dict(snap=([0], [3], [5])), E.SnapshotRequestError, "accepted tokens"),  # past the 2 accepted
    (dict(snap=([1], [1], [5])), E.SnapshotRequestError, "1..0"),  # a plain row has nothing accepted
    (dict(snap=([0], [1], [7])), E.DuplicateSlotError, "slot 7"),  # a destination that is a row's slot
    (dict(snap=([0], [1], [PAD_SLOT_ID])), E.SlotIndexError, "destination"),
])
def test_mixed_and_commit_snapshot_errors_change_nothing(layer, args, error, match):
    pool = busy_pool(seed=17)
    pos = pool.seq_len[[3, 7]].copy()
    x, cu, _ = packed([4, 2], seed=17)
    before = copy_pool(pool)
    if "verify" in args:
        with pytest.raises(error, match=match):
            forward_mixed(layer, pool, x, cu, pos, [3, 7], args["verify"])
        assert_slots_identical(pool, before, range(pool.batch))
        return
    _, _, spec = forward_mixed(layer, pool, x, cu, pos, [3, 7], [1, 0])
    after = copy_pool(pool)
    snap = args.get("snap", ((), (), ()))
    with pytest.raises(error, match=match):
        commit(spec, args.get("accepted", [2, 0]), *snap)
    assert_slots_identical(pool, after, range(pool.batch))
    commit(spec, [2, 0])  # refused, so still to commit


def test_a_plain_rows_slot_moving_does_not_block_the_commit(layer):
    """The mixed call itself moves its plain rows' seq_len: the commit checks its verify rows' slots only."""
    pool = busy_pool(seed=19)
    pos = pool.seq_len[[3, 7]].copy()
    x, cu, _ = packed([4, 2], seed=19)
    _, _, spec = forward_mixed(layer, pool, x, cu, pos, [3, 7], [1, 0])
    assert pool.seq_len[7] == pos[1] + 2
    commit(spec, [4, 0])
    assert pool.seq_len[3] == pos[0] + 4


def test_a_stale_verify_rows_slot_still_blocks_the_commit(layer):
    pool = busy_pool(seed=23)
    pos = pool.seq_len[[3, 7]].copy()
    x, cu, _ = packed([4, 2], seed=23)
    _, _, spec = forward_mixed(layer, pool, x, cu, pos, [3, 7], [1, 0])
    pool.free([3])
    with pytest.raises(E.SpecCommitError, match="slot 3"):
        commit(spec, [1, 0])

