"""Serving promises (docs/serving.md §6, issue 14 item 5): a packed call is separate plain calls in
any order of its sequences and any assignment of slots, padding sequences and unnamed slots are not
touched, verify + commit(n) is a plain decode of n tokens, a prefix snapshot is the state of the
truncated prefill. Each compares the implementation's serving path with the float64 reference's
plain calls (or checks an exact identity). An implementation without the serving patterns skips.

They are bookkeeping, not arithmetic: profile-independent (``once``), so the gate runs them in one
profile only (under Triton's interpreter every example is a few packed calls).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from gdncheck.calls import PAD_SLOT_ID
from gdncheck.harness import NotApplicable, to_numpy
from gdncheck.stages import STATE_NAMES

from .check import assert_close, assert_identical
from .metamorphic import _setup
from .registry import PropertySkip, Subject, prop, run_calls
from .strategies import build_inputs


def _call(impl, op: str, *args):
    fn = getattr(impl, op, None)
    try:
        if fn is None:
            raise NotApplicable(f"no {op}")
        return fn(*args)
    except NotApplicable as exc:
        raise PropertySkip(f"{getattr(impl, 'name', 'the implementation')} runs no serving patterns ({exc})") from None


def _pool(impl, pool) -> dict[str, np.ndarray]:
    return {k: np.array(to_numpy(v), dtype=np.float64) for k, v in impl.state_arrays(pool).items()}


def _per_sequence(out, trace, cu, i: int) -> dict[str, np.ndarray]:
    """Sequence i's rows of a packed call's tensors, as one plain call's [1, L_i, ...]."""
    s, e = int(cu[i]), int(cu[i + 1])
    d = {k: np.array(to_numpy(v), dtype=np.float64)[None, s:e] for k, v in trace.items()}
    d["out"] = np.array(to_numpy(out), dtype=np.float64)[None, s:e]
    return d


def _slot(pool: dict, slot: int) -> dict[str, np.ndarray]:
    return {k: pool[k][None, slot] for k in STATE_NAMES}


def _layout(data, n_max: int = 4, len_max: int = 20):
    n = data.draw(st.integers(1, n_max), label="sequences")
    lengths = [data.draw(st.integers(1, len_max), label=f"length of sequence {i}") for i in range(n)]
    pool_size = data.draw(st.integers(n, n + 3), label="pool size")
    slots = data.draw(st.permutations(range(pool_size)), label="slot order")[:n]
    return lengths, pool_size, [int(s) for s in slots]


def _stream(cfg, xd, lengths):
    x = build_inputs(cfg, 1, sum(lengths), xd)[0]
    return x, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


@prop("serving", once=True)
def packing_invariance(subject: Subject, data) -> None:
    """A packed call of N sequences (any lengths, any order, any slots of a larger pool) gives each
    sequence the reference's plain call on it, outputs and the state in its slot."""
    cfg, wd, weights, xd = _setup(data)
    lengths, pool_size, slots = _layout(data)
    x, cu = _stream(cfg, xd, lengths)
    impl = subject.make(cfg, weights)
    pool = impl.new_state(pool_size)
    out, trace = _call(impl, "forward_packed", x, pool, cu, np.zeros(len(lengths), np.int64), np.array(slots))
    after = _pool(impl, pool)
    ref = Subject.reference(cfg, weights)
    for i, slot in enumerate(slots):
        _, want = run_calls(ref, [(x[None, cu[i]:cu[i + 1]], 0)])
        got = {**_per_sequence(out, trace, cu, i), **_slot(after, slot)}
        assert_close([got], want, subject.profile, f"sequence {i} of a packed call of lengths {lengths} on slots "
                                                   f"{slots} of {pool_size}, {cfg.summary()}, {wd!r}, {xd!r}")


@prop("serving", once=True)
def padding_and_other_slots_untouched(subject: Subject, data) -> None:
    """A packed call with padding sequences (slot -1) leaves every slot it does not name bit-identical,
    and computes each padding sequence as the reference from a zero state."""
    cfg, wd, weights, xd = _setup(data)
    lengths, pool_size, slots = _layout(data, n_max=3, len_max=12)
    pad = data.draw(st.lists(st.booleans(), min_size=len(slots), max_size=len(slots)).filter(any), label="padding")
    slots = [PAD_SLOT_ID if p else s for s, p in zip(slots, pad)]
    x, cu = _stream(cfg, xd, lengths)
    impl = subject.make(cfg, weights)
    pool = impl.new_state(pool_size)
    every = np.arange(pool_size)
    warm = build_inputs(cfg, 1, 3 * pool_size, xd)[0]
    _call(impl, "forward_packed", warm, pool, np.arange(0, 3 * pool_size + 1, 3), np.zeros(pool_size, np.int64), every)
    before = _pool(impl, pool)
    pos = np.array([0 if s == PAD_SLOT_ID else 3 for s in slots], dtype=np.int64)
    out, trace = _call(impl, "forward_packed", x, pool, cu, pos, np.array(slots))
    after = _pool(impl, pool)
    named = {s for s in slots if s != PAD_SLOT_ID}
    for s in sorted(set(range(pool_size)) - named):
        assert_identical({k: after[k][s] for k in after}, {k: before[k][s] for k in before},
                         f"slot {s}, not named by a packed call on slots {slots} (padding {PAD_SLOT_ID})")
    ref = Subject.reference(cfg, weights)
    for i, s in enumerate(slots):
        if s == PAD_SLOT_ID:
            _, want = run_calls(ref, [(x[None, cu[i]:cu[i + 1]], 0)])
            want = [{k: v for k, v in want[0].items() if k not in STATE_NAMES and k != "seq_len"}]
            assert_close([_per_sequence(out, trace, cu, i)], want, subject.profile,
                         f"padding sequence {i} of lengths {lengths}, {cfg.summary()}")


@prop("serving", once=True)
def verify_commit_is_plain_decode(subject: Subject, data) -> None:
    """After a prefill, verify of k draft tokens then commit(n) leaves each slot as the reference's plain
    prefill then n one-token calls (n = 0 leaves it as the prefill), seq_len = prefill + n."""
    cfg, wd, weights, xd = _setup(data)
    n = data.draw(st.integers(1, 3), label="sequences")
    pre = [data.draw(st.integers(1, 12), label=f"prefill of sequence {i}") for i in range(n)]
    k = data.draw(st.integers(1, 4), label="draft tokens")
    acc = [data.draw(st.integers(0, k), label=f"accepted by sequence {i}") for i in range(n)]
    slots = np.array(data.draw(st.permutations(range(n + 1)), label="slot order")[:n])
    x, cu = _stream(cfg, xd, [p + k for p in pre])
    impl = subject.make(cfg, weights)
    pool = impl.new_state(n + 1)
    first = np.concatenate([x[cu[i]:cu[i] + pre[i]] for i in range(n)])
    drafts = np.concatenate([x[cu[i] + pre[i]:cu[i + 1]] for i in range(n)])
    _call(impl, "forward_packed", first, pool, np.concatenate([[0], np.cumsum(pre)]), np.zeros(n, np.int64), slots)
    _, _, spec = _call(impl, "verify_spec", drafts, pool, np.arange(0, n * k + 1, k), np.array(pre), slots)
    _call(impl, "commit", spec, np.array(acc))
    after = _pool(impl, pool)
    ref = Subject.reference(cfg, weights)
    for i, s in enumerate(slots.tolist()):
        _, want = run_calls(ref, [(x[None, cu[i]:cu[i] + pre[i] + acc[i]], 0)])
        if "seq_len" in after and int(after["seq_len"][s]) != pre[i] + acc[i]:
            raise AssertionError(f"slot {s} seq_len {int(after['seq_len'][s])} after commit({acc[i]}), but should be "
                                 f"{pre[i] + acc[i]} [prefill {pre[i]}, k {k}]")
        assert_close([_slot(after, s)], [{t: want[0][t] for t in STATE_NAMES}], subject.profile,
                     f"slot {s} after prefill {pre[i]}, verify of {k}, commit({acc[i]}), {cfg.summary()}, {wd!r}")


@prop("serving", once=True)
def prefix_snapshot_is_truncated_prefill(subject: Subject, data) -> None:
    """A prefix snapshot after o tokens of a prefill (o anywhere: at a chunk end or inside one) holds the
    reference's state after a plain prefill of those o tokens, seq_len = o."""
    cfg, wd, weights, xd = _setup(data)
    L = data.draw(st.integers(2, 40), label="prefill tokens")
    offsets = sorted(set(data.draw(st.lists(st.integers(1, L), min_size=1, max_size=3), label="snapshot offsets")))
    x, cu = _stream(cfg, xd, [L])
    impl = subject.make(cfg, weights)
    pool = impl.new_state(1 + len(offsets))
    dest = np.arange(1, 1 + len(offsets))
    _call(impl, "prefix_snapshots", x, pool, cu, np.zeros(1, np.int64), np.array([0]),
          np.zeros(len(offsets), np.int64), np.array(offsets), dest)
    after = _pool(impl, pool)
    ref = Subject.reference(cfg, weights)
    for o, d in zip(offsets, dest.tolist()):
        _, want = run_calls(ref, [(x[None, :o], 0)])
        if "seq_len" in after and int(after["seq_len"][d]) != o:
            raise AssertionError(f"snapshot slot {d} seq_len {int(after['seq_len'][d])}, but should be {o}")
        assert_close([_slot(after, d)], [{t: want[0][t] for t in STATE_NAMES}], subject.profile,
                     f"prefix snapshot after {o} of {L} tokens (slot {d}), {cfg.summary()}, {wd!r}, {xd!r}")
