"""The serving patterns of the reference (docs/serving.md) against their equivalent plain calls:
packed calls over pool slots, the padding slot, the per-slot seq-len rule, speculative verify and commit,
prefix snapshots, and every input error. "Plain call" is ``Layer.forward`` on a one-row State copied from
the slot before the call; outputs and states agree to 1e-12 normwise, untouched slots bit for bit."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdncheck import errors as E
from gdncheck.calls import PAD_SLOT_ID, SERVING_OPS, SPEC_STEP_TENSORS
from gdncheck.reference import (
    Layer,
    SpecVerify,
    State,
    StatePool,
    commit,
    forward_packed,
    prefix_snapshots,
    verify_spec,
)
from gdncheck.reference import serving as serving_module
from gdncheck.stages import STAGE_TENSORS
from gdncheck.synthetic import make_inputs, make_weights
from tests.helpers import rel_err, tiny_config

CFG = tiny_config()
TOL = 1e-12
POOL = 8


@pytest.fixture(scope="module")
def layer():
    return Layer(CFG, make_weights(CFG, seed=0))


def busy_pool(seed=0, size=POOL) -> StatePool:
    """A pool whose every slot holds an arbitrary state at an arbitrary position (a valid pool)."""
    rng = np.random.default_rng(seed)
    pool = StatePool(CFG, size)
    pool.conv_state[:] = rng.normal(size=pool.conv_state.shape)
    pool.recurrent_state[:] = rng.normal(scale=0.3, size=pool.recurrent_state.shape)
    pool.seq_len[:] = rng.integers(1, 500, size=size)
    return pool


def packed(lengths, seed=1):
    """x [total, D] and cu_seqlens for sequences of the given lengths, and each sequence's rows."""
    xs = [make_inputs(CFG, 1, n, seed=seed + i)[0] for i, n in enumerate(lengths)]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return np.concatenate(xs), cu, xs


def slot_state(pool: State, slot: int) -> State:
    """R(P, s): a one-row State holding a copy of slot s (the zero state for the padding id)."""
    r = State(CFG, 1)
    if slot != PAD_SLOT_ID:
        r.conv_state[0], r.recurrent_state[0], r.seq_len[0] = pool.conv_state[slot], pool.recurrent_state[slot], \
            pool.seq_len[slot]
    r.warned = True  # the warning is the pool's business here; plain calls stay quiet
    return r


def plain(layer, pool_before, slot, x_i, pos):
    """The plain call a packed sequence must equal: (out [T, D], trace, state after)."""
    r = slot_state(pool_before, slot)
    out, trace = layer.forward(x_i[None], r, pos if slot != PAD_SLOT_ID else 0)
    return out[0], {name: t[0] for name, t in trace.items()}, r


def copy_pool(pool: State) -> State:
    c = StatePool(CFG, pool.batch)
    c.restore(pool.snapshot())
    return c


def assert_slot_equals(pool, slot, state: State):
    assert rel_err(pool.recurrent_state[slot], state.recurrent_state[0]) <= TOL
    assert rel_err(pool.conv_state[slot], state.conv_state[0]) <= TOL
    assert pool.seq_len[slot] == state.seq_len[0]


def assert_slots_identical(a: State, b: State, slots):
    for s in slots:
        np.testing.assert_array_equal(a.conv_state[s], b.conv_state[s])
        np.testing.assert_array_equal(a.recurrent_state[s], b.recurrent_state[s])
        assert a.seq_len[s] == b.seq_len[s]


def check_packed_against_plain(layer, before, after, out, trace, cu, xs, seq_pos, slots, *, writes=True,
                               also_written=()):
    """Each sequence's rows of out and of every stage tensor equal its plain call; with ``writes``, its slot
    holds the plain call's final state. Every slot not written (``also_written``: snapshot destinations)
    is bit-identical to before."""
    for i, (x_i, pos, slot) in enumerate(zip(xs, seq_pos, slots)):
        rows = slice(cu[i], cu[i + 1])
        want, want_trace, r = plain(layer, before, slot, x_i, pos)
        assert rel_err(out[rows], want) <= TOL, f"sequence {i}"
        for spec in STAGE_TENSORS:
            assert rel_err(trace[spec.name][rows], want_trace[spec.name]) <= TOL, (i, spec.name)
        if writes and slot != PAD_SLOT_ID:
            assert_slot_equals(after, slot, r)
    written = {s for s in slots if s != PAD_SLOT_ID} if writes else set()
    untouched = sorted(set(range(before.batch)) - written - set(also_written))
    assert_slots_identical(after, before, untouched)


# --- packed calls ----------------------------------------------------------------------------------
def test_mixed_lengths_permuted_slots_equal_plain_calls(layer):
    lengths, slots = [1, 63, 64, 65, 1], [6, 0, 3, 7, 2]
    pool = busy_pool()
    seq_pos = pool.seq_len[slots].copy()
    before = copy_pool(pool)
    x, cu, xs = packed(lengths)
    out, trace = forward_packed(layer, pool, x, cu, seq_pos, slots)
    assert out.shape == x.shape and set(trace) == {t.name for t in STAGE_TENSORS}
    check_packed_against_plain(layer, before, pool, out, trace, cu, xs, seq_pos, slots)
    assert pool.seq_len[slots].tolist() == (seq_pos + lengths).tolist()


def test_slots_reused_across_calls(layer):
    """Two calls on the same slots in another order continue each request where it stopped."""
    pool = StatePool(CFG, 4)
    first, cu1, xs1 = packed([65, 1], seed=10)
    second, cu2, xs2 = packed([1, 64], seed=20)
    forward_packed(layer, pool, first, cu1, [0, 0], [3, 1])
    out, _ = forward_packed(layer, pool, second, cu2, [1, 65], [1, 3])
    for x_a, x_b, slot, rows in ((xs1[1], xs2[0], 1, slice(0, 1)), (xs1[0], xs2[1], 3, slice(1, 65))):
        r = State(CFG, 1)
        layer.forward(x_a[None], r, 0)
        want, _ = layer.forward(x_b[None], r, x_a.shape[0])
        assert rel_err(out[rows], want[0]) <= TOL
        assert_slot_equals(pool, slot, r)
    assert pool.seq_len.tolist() == [0, 2, 0, 129]
    assert not pool.conv_state[[0, 2]].any() and not pool.recurrent_state[[0, 2]].any()


def test_batched_plain_call_is_a_packed_call(layer):
    B, T = 3, 37
    x = make_inputs(CFG, B, T, seed=5)
    state = layer.new_state(B)
    layer.forward(x[:, :9], state, 0)
    pool = layer.new_state(B)  # a plain State is a pool whose slots are its rows
    pool.restore(state.snapshot())
    want, want_trace = layer.forward(x[:, 9:], state, 9)
    out, trace = forward_packed(layer, pool, x[:, 9:].reshape(-1, CFG.hidden_size), np.arange(B + 1) * (T - 9),
                                9, list(range(B)))
    assert rel_err(out, want.reshape(out.shape)) <= TOL
    assert rel_err(trace["core"], want_trace["core"].reshape(trace["core"].shape)) <= TOL
    assert rel_err(pool.recurrent_state, state.recurrent_state) <= TOL
    assert rel_err(pool.conv_state, state.conv_state) <= TOL
    assert pool.seq_len.tolist() == state.seq_len.tolist()


@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(1, 70), min_size=1, max_size=5), data=st.data())
def test_packing_invariance_any_order_any_slots(layer, lengths, data):
    slots = data.draw(st.permutations(range(POOL)), label="slots")[: len(lengths)]
    pool = busy_pool(seed=len(lengths))
    seq_pos = pool.seq_len[slots].copy()
    before = copy_pool(pool)
    x, cu, xs = packed(lengths, seed=sum(lengths))
    out, trace = forward_packed(layer, pool, x, cu, seq_pos, slots)
    check_packed_against_plain(layer, before, pool, out, trace, cu, xs, seq_pos, slots)


def test_padding_sequences_touch_no_slot(layer):
    """-1 is the padding id: computed from zeros; the last slot (what -1 indexes in NumPy) stays as it was."""
    pool = busy_pool(seed=3)
    slots = [PAD_SLOT_ID, 2, PAD_SLOT_ID]
    seq_pos = [123, int(pool.seq_len[2]), 0]
    before = copy_pool(pool)
    x, cu, xs = packed([5, 3, 1], seed=30)
    out, trace = forward_packed(layer, pool, x, cu, seq_pos, slots)
    check_packed_against_plain(layer, before, pool, out, trace, cu, xs, seq_pos, slots)
    assert_slots_identical(pool, before, [POOL - 1])
    assert not pool.warned  # a padding sequence's position meets no slot, so no mismatch


def test_seq_pos_mismatch_resets_only_that_slot(layer, caplog):
    pool = busy_pool(seed=4)
    slots = [1, 5, 2]
    seq_pos = pool.seq_len[slots].copy()
    seq_pos[1] += 7  # sequence 1 jumps: its slot is read as zeros
    before = copy_pool(pool)
    x, cu, xs = packed([4, 65, 1], seed=40)
    with caplog.at_level(logging.WARNING, logger="gdncheck.reference"):
        out, trace = forward_packed(layer, pool, x, cu, seq_pos, slots)
    assert pool.warned
    check_packed_against_plain(layer, before, pool, out, trace, cu, xs, seq_pos, slots)
    zero = State(CFG, 1)
    want, _ = layer.forward(xs[1][None], zero, int(seq_pos[1]))  # from zeros, as the reset makes it
    assert rel_err(out[cu[1]:cu[2]], want[0]) <= TOL
    assert_slot_equals(pool, 5, zero)
    with caplog.at_level(logging.WARNING, logger="gdncheck.reference"):
        forward_packed(layer, pool, x[:1], [0, 1], 0, [7])  # another mismatch: no second warning
    check = [r for r in caplog.records if "slot(s)" in r.getMessage()]
    assert len(check) == 1 and "sequence 1 (slot 5)" in check[0].getMessage()


def test_strict_mismatch_raises_and_changes_nothing(layer):
    pool = busy_pool(seed=5)
    slots = [1, 5]
    seq_pos = pool.seq_len[slots].copy()
    seq_pos[1] = 0
    before = copy_pool(pool)
    x, cu, _ = packed([3, 2], seed=50)
    with pytest.raises(E.SeqPosMismatchError, match=r"sequence 1 \(slot 5\)") as info:
        forward_packed(layer, pool, x, cu, seq_pos, slots, strict=True)
    assert info.value.code == "seq_pos_mismatch"
    assert_slots_identical(pool, before, range(POOL))
    assert pool.warned == before.warned
    strict_layer = Layer(CFG, make_weights(CFG, seed=0), strict=True)
    for call in (lambda: verify_spec(strict_layer, pool, x, cu, seq_pos, slots),
                 lambda: prefix_snapshots(strict_layer, pool, x, cu, seq_pos, slots, [0], [1], [0])):
        with pytest.raises(E.SeqPosMismatchError):
            call()
        assert_slots_identical(pool, before, range(POOL))


# --- speculative verify and commit -----------------------------------------------------------------
@pytest.fixture()
def verified(layer):
    """A verify over k = 4, 4, 1, 3 draft tokens (one padding sequence), on a busy pool."""
    pool = busy_pool(seed=6)
    slots = [4, 1, 7, PAD_SLOT_ID]
    seq_pos = np.array([*pool.seq_len[slots[:3]], 0])
    before = copy_pool(pool)
    x, cu, xs = packed([4, 4, 1, 3], seed=60)
    out, trace, spec = verify_spec(layer, pool, x, cu, seq_pos, slots)
    return pool, before, slots, seq_pos, cu, xs, out, trace, spec


def test_verify_outputs_and_every_step_state(layer, verified):
    pool, before, slots, seq_pos, cu, xs, out, trace, spec = verified
    assert isinstance(spec, SpecVerify)
    assert_slots_identical(pool, before, range(POOL))  # verify writes no slot
    check_packed_against_plain(layer, before, pool, out, trace, cu, xs, seq_pos, slots, writes=False)
    for i, (x_i, slot) in enumerate(zip(xs, slots)):
        for j in range(1, x_i.shape[0] + 1):
            _, _, r = plain(layer, before, slot, x_i[:j], seq_pos[i])
            row = cu[i] + j - 1
            assert rel_err(spec.recurrent_state_steps[row], r.recurrent_state[0]) <= TOL, (i, j)
            assert rel_err(spec.conv_state_steps[row], r.conv_state[0]) <= TOL, (i, j)


def test_verify_outputs_equal_the_plain_call_of_all_draft_tokens(layer, verified):
    _, before, slots, seq_pos, cu, xs, out, _, _ = verified
    for i, (x_i, slot) in enumerate(zip(xs, slots)):
        want, _, _ = plain(layer, before, slot, x_i, seq_pos[i])
        assert rel_err(out[cu[i]:cu[i + 1]], want) <= TOL


def test_commit_zero_one_and_k(layer, verified):
    pool, before, slots, seq_pos, cu, xs, _, _, spec = verified
    accepted = [0, 1, 1, 2]  # slot 4 keeps nothing, slot 1 one token, slot 7 all of its k = 1
    commit(spec, accepted)
    assert_slots_identical(pool, before, [4] + [s for s in range(POOL) if s not in (1, 7)])
    for i in (1, 2):
        _, _, r = plain(layer, before, slots[i], xs[i][:accepted[i]], seq_pos[i])
        assert_slot_equals(pool, slots[i], r)
    # the next call continues from the committed position with no reset, and equals the plain decode
    nxt, cu_n, _ = packed([1, 1], seed=70)
    pos_n = [seq_pos[1] + 1, seq_pos[2] + 1]
    out, _ = forward_packed(layer, pool, nxt, cu_n, pos_n, [1, 7], strict=True)
    for i, row in ((1, 0), (2, 1)):
        r = slot_state(before, slots[i])
        layer.forward(xs[i][None, :accepted[i]], r, int(seq_pos[i]))
        want, _ = layer.forward(nxt[None, row:row + 1], r, pos_n[row])
        assert rel_err(out[row], want[0, 0]) <= TOL


def test_commit_all_k(layer, verified):
    pool, before, slots, seq_pos, _, xs, _, _, spec = verified
    commit(spec, [4, 4, 1, 3])
    for i in range(3):
        _, _, r = plain(layer, before, slots[i], xs[i], seq_pos[i])
        assert_slot_equals(pool, slots[i], r)


def test_verify_after_a_mismatch_commits_from_zeros(layer):
    pool = busy_pool(seed=8)
    before = copy_pool(pool)
    x, cu, xs = packed([3], seed=80)
    _, _, spec = verify_spec(layer, pool, x, cu, [0], [2])
    assert_slots_identical(pool, before, range(POOL))
    commit(spec, [2])
    zero = State(CFG, 1)
    layer.forward(xs[0][None, :2], zero, 0)
    assert_slot_equals(pool, 2, zero)


def test_commit_errors_change_nothing(layer, verified):
    pool, before, slots, seq_pos, cu, _, _, _, spec = verified
    with pytest.raises(E.AcceptCountError, match=r"accepted=5 for sequence 0 \(k=4\)") as info:
        commit(spec, [5, 0, 0, 0])
    assert info.value.code == "accept_count"
    with pytest.raises(E.AcceptCountError):
        commit(spec, [0, -1, 0, 0])
    with pytest.raises(E.AcceptCountError, match="sequence 3"):
        commit(spec, [0, 0, 0, 4])  # a padding sequence's count is still checked
    with pytest.raises(E.InputShapeError, match="accepted"):
        commit(spec, [1, 1])
    assert_slots_identical(pool, before, range(POOL))
    # a call that moves one of the verify's slots makes it stale
    x, cu1, _ = packed([1], seed=90)
    forward_packed(layer, pool, x, cu1, seq_pos[1], [1])
    moved = copy_pool(pool)
    with pytest.raises(E.SpecCommitError, match="slot 1 .sequence 1.") as info:
        commit(spec, [1, 1, 1, 1])
    assert info.value.code == "spec_commit"
    assert_slots_identical(pool, moved, range(POOL))


def test_commit_twice_is_refused(layer, verified):
    pool, *_, spec = verified
    commit(spec, [1, 0, 0, 0])
    after = copy_pool(pool)
    with pytest.raises(E.SpecCommitError, match="already committed"):
        commit(spec, [2, 0, 0, 0])
    assert_slots_identical(pool, after, range(POOL))


# --- prefix snapshots ------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_size", [64, 16])
def test_prefix_snapshots_equal_truncated_prefills(chunk_size):
    layer = Layer(CFG, make_weights(CFG, seed=0), chunk_size=chunk_size)
    pool = busy_pool(seed=9)
    slots = [3, 6]
    seq_pos = pool.seq_len[slots].copy()
    before = copy_pool(pool)
    x, cu, xs = packed([130, 65], seed=100)
    # chunk boundaries (multiples of C) and offsets inside chunks, the first and the last token
    offsets = [(0, 64), (0, 1), (0, 30), (0, 128), (0, 129), (0, 130), (1, 16), (1, 33), (1, 65)]
    snap_seq = [i for i, _ in offsets]
    snap_off = [o for _, o in offsets]
    dests = [0, 1, 2, 4, 5, 7, 8, 9, 10]
    pool11 = StatePool(CFG, 11)
    pool11.conv_state[:POOL], pool11.recurrent_state[:POOL], pool11.seq_len[:POOL] = \
        pool.conv_state, pool.recurrent_state, pool.seq_len
    out, trace = prefix_snapshots(layer, pool11, x, cu, seq_pos, slots, snap_seq, snap_off, dests)
    big_before = copy_pool(pool11)
    big_before.conv_state[:POOL], big_before.recurrent_state[:POOL], big_before.seq_len[:POOL] = \
        before.conv_state, before.recurrent_state, before.seq_len
    check_packed_against_plain(layer, big_before, pool11, out, trace, cu, xs, seq_pos, slots, also_written=dests)
    for (i, o), d in zip(offsets, dests):
        _, _, r = plain(layer, before, slots[i], xs[i][:o], seq_pos[i])
        assert_slot_equals(pool11, d, r)
    # continuing from a mid-chunk snapshot gives the rest of the full prefill
    full, _, _ = plain(layer, before, slots[0], xs[0], seq_pos[0])
    rest, _ = forward_packed(layer, pool11, xs[0][30:], [0, 100], seq_pos[0] + 30, [2], strict=True)
    assert rel_err(rest, full[30:]) <= TOL


# --- input errors ----------------------------------------------------------------------------------
X, CU, _ = packed([2, 3], seed=110)
GOOD = dict(x=X, cu_seqlens=CU, seq_pos=[0, 0], slots=[0, 1])

BAD_CALLS = [
    ("x 3-D", dict(x=X[None]), E.InputShapeError, r"\[total_tokens>=1, D=8\]"),
    ("x wrong D", dict(x=X[:, :5]), E.InputShapeError, "found \\[5, 5\\]"),
    ("x integer", dict(x=X.astype(np.int32)), E.InputDtypeError, "int32"),
    ("cu float", dict(cu_seqlens=CU.astype(float)), E.CuSeqlensError, "1-D integer"),
    ("cu one entry", dict(cu_seqlens=[0]), E.CuSeqlensError, "N \\+ 1 >= 2"),
    ("cu start", dict(cu_seqlens=[1, 2, 5]), E.CuSeqlensError, "cu_seqlens\\[0\\] = 0, found 1"),
    ("cu decreasing", dict(cu_seqlens=[0, 4, 2, 5], seq_pos=0, slots=[0, 1, 2]), E.CuSeqlensError,
     "cu_seqlens\\[1\\]=4 > cu_seqlens\\[2\\]=2"),
    ("cu end", dict(cu_seqlens=[0, 2, 4]), E.CuSeqlensError, "total_tokens = 5"),
    ("empty sequence", dict(cu_seqlens=[0, 2, 2, 5], seq_pos=0, slots=[0, 1, 2]), E.EmptySequenceError,
     "sequence\\(s\\) \\[1\\]"),
    ("seq_pos count", dict(seq_pos=[0, 0, 0]), E.InputShapeError, "2 ints"),
    ("seq_pos negative", dict(seq_pos=[0, -1]), E.InputError, ">= 0"),
    ("slots count", dict(slots=[0]), E.InputShapeError, "slots as 2 ints"),
    ("slots float", dict(slots=[0.0, 1.0]), E.InputShapeError, "slots"),
    ("slot past the pool", dict(slots=[0, POOL]), E.SlotIndexError, f"found slot {POOL} for sequence 1"),
    ("slot -2", dict(slots=[-2, 1]), E.SlotIndexError, "found slot -2 for sequence 0"),
    ("duplicate slot", dict(slots=[3, 3]), E.DuplicateSlotError, "slot 3 for sequence 0 and sequence 1"),
]


@pytest.mark.parametrize("what,change,error,message", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
@pytest.mark.parametrize("op", ["forward_packed", "verify_spec", "prefix_snapshots"])
def test_bad_calls_are_refused_and_change_nothing(layer, op, what, change, error, message):
    pool = busy_pool(seed=11)
    pool.seq_len[:] = 0
    before = copy_pool(pool)
    args = {**GOOD, **change}
    call = (args["x"], args["cu_seqlens"], args["seq_pos"], args["slots"])
    extra = ([], [], []) if op == "prefix_snapshots" else ()
    with pytest.raises(error, match=message) as info:
        getattr(serving_module, op)(layer, pool, *call, *extra)
    assert info.value.code == error.code
    assert_slots_identical(pool, before, range(POOL))


BAD_SNAPSHOTS = [
    ("sequence out of range", ([2], [1], [5]), E.SnapshotRequestError, "snap_seq in \\[0, 2\\)"),
    ("padding sequence", ([1], [1], [5]), E.SnapshotRequestError, "padding sequence 1"),
    ("offset 0", ([0], [0], [5]), E.SnapshotRequestError, "1..2"),
    ("offset past the end", ([0], [3], [5]), E.SnapshotRequestError, "found 3 at request 0"),
    ("same offset twice", ([0, 0], [1, 1], [5, 6]), E.SnapshotRequestError, "offset 1 twice"),
    ("destination -1", ([0], [1], [-1]), E.SlotIndexError, "never the padding id"),
    ("destination past the pool", ([0], [1], [POOL]), E.SlotIndexError, f"found slot {POOL}"),
    ("destination is a sequence's slot", ([0], [1], [0]), E.DuplicateSlotError,
     "slot 0 for sequence 0 and snapshot request 0"),
    ("destination twice", ([0, 0], [1, 2], [5, 5]), E.DuplicateSlotError, "request 0 and snapshot request 1"),
    ("lengths differ", ([0, 0], [1], [5, 6]), E.InputShapeError, "snap_offset"),
]


@pytest.mark.parametrize("what,request_,error,message", BAD_SNAPSHOTS, ids=[c[0] for c in BAD_SNAPSHOTS])
def test_bad_snapshot_requests_are_refused(layer, what, request_, error, message):
    pool = busy_pool(seed=12)
    pool.seq_len[:] = 0
    before = copy_pool(pool)
    with pytest.raises(error, match=message) as info:
        prefix_snapshots(layer, pool, X, CU, 0, [0, PAD_SLOT_ID], *request_)
    assert info.value.code == error.code
    assert_slots_identical(pool, before, range(POOL))


def test_a_pool_of_other_dimensions_or_type_is_refused(layer):
    other = StatePool(tiny_config(dv=5), 4)
    with pytest.raises(E.InputShapeError, match="state dimensions"):
        forward_packed(layer, other, X, CU, 0, [0, 1])
    with pytest.raises(E.InputError, match="found dict"):
        forward_packed(layer, {}, X, CU, 0, [0, 1])


def test_serving_vocabulary():
    """Every op of gdncheck.calls.SERVING_OPS is a reference function; the step tensors are SpecVerify's."""
    for op in SERVING_OPS:
        assert callable(getattr(serving_module, op)), op
    assert set(SPEC_STEP_TENSORS) <= set(SpecVerify.__dataclass_fields__)
    codes = {cls.code for cls in E.all_error_classes()}
    assert {"cu_seqlens", "empty_sequence", "slot_index", "duplicate_slot", "accept_count", "snapshot_request",
            "spec_commit"} <= codes
    assert StatePool(CFG, 3).size == 3


def test_free_zeroes_slots():
    pool = busy_pool(seed=13)
    before = copy_pool(pool)
    pool.free([2, 5])
    assert not pool.conv_state[[2, 5]].any() and not pool.recurrent_state[[2, 5]].any()
    assert pool.seq_len[[2, 5]].tolist() == [0, 0]
    assert_slots_identical(pool, before, [0, 1, 3, 4, 6, 7])
