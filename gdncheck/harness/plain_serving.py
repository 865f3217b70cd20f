"""The serving patterns of docs/serving.md by their definition: plain calls on one-row states.

For a layer that has only ``new_state(batch)`` and ``forward(x, state, seq_pos)`` (a state with
``conv_state``, ``recurrent_state``, ``seq_len`` rows that can be assigned): each sequence of a packed
call is one plain call on a one-row state holding a copy of its slot (a zero state for the padding id),
and the pool is written only after every sequence ran, so a refused call (strict mode) changes nothing.
docs/serving.md §2-§4 define the patterns so; this module is that sentence as code.

It lets a layer that has no packed path *earn* bounds on serving cases (the precision emulation in
``gdncheck tolerances derive``): what it computes is correct by definition. It is never how an
implementation claims to run packed calls: that is what the serving cases test (``LayerAdapter``'s
``serving``). Bookkeeping only, no math: the harness's floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gdncheck.calls import (
    PAD_SLOT_ID,
    check_accepted,
    check_commit_snapshots,
    check_cu_seqlens,
    check_slots,
    check_snapshot_requests,
    check_verify_rows,
)

from .contract import to_numpy

STATE_FIELDS = ("conv_state", "recurrent_state", "seq_len")


def _row(layer, pool, slot: int):
    """A one-row state holding a copy of ``slot`` (zeros, seq_len 0, for the padding id)."""
    one = layer.new_state(1)
    if slot != PAD_SLOT_ID:
        for f in STATE_FIELDS:
            getattr(one, f)[0] = getattr(pool, f)[slot]
    return one


def _put(pool, slot: int, one) -> None:
    for f in STATE_FIELDS:
        getattr(pool, f)[slot] = getattr(one, f)[0]


def _cat(pieces: list[tuple[Any, dict]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Plain calls' (out, trace) of [1, n, ...] in stream order -> the packed [total, ...] arrays."""
    names = [n for n in pieces[0][1] if all(n in t for _, t in pieces)]
    out = np.concatenate([to_numpy(o)[0] for o, _ in pieces])
    return out, {n: np.concatenate([to_numpy(t[n])[0] for _, t in pieces]) for n in names}


def _checked(layer, pool, x, cu_seqlens, slots):
    """The call's stream and slots checked as every serving port checks them (gdncheck.calls: an empty
    sequence, a slot outside the pool, a slot named twice are refused before anything runs). Returns
    (x as NumPy, cu_seqlens, lengths, slots), the last three int64."""
    x, where = np.asarray(to_numpy(x)), getattr(layer, "layer_index", None)
    cu, lengths = check_cu_seqlens(cu_seqlens, x.shape[0], where)
    return x, cu, lengths, check_slots(slots, lengths.shape[0], len(pool.seq_len), where)


def _run(layer, pool, x, cu_seqlens, seq_pos, slots, cuts):
    """Each sequence i from its slot, in plain calls split at ``cuts[i]`` (its length last); returns the
    packed (out, trace) and per sequence {offset: a one-row state after that many tokens}."""
    pieces, states = [], []
    for i, s in enumerate(cu_seqlens[:-1].tolist()):
        one, at, prev = _row(layer, pool, int(slots[i])), {}, 0
        for cut in cuts[i]:
            pieces.append(layer.forward(x[None, s + prev: s + cut], one, np.array([seq_pos[i] + prev])))
            at[cut] = _row(layer, one, 0)  # a copy
            prev = cut
        states.append(at)
    out, trace = _cat(pieces)
    return out, trace, states


def forward_packed(layer, pool, x, cu_seqlens, seq_pos, slots):
    x, cu_seqlens, lengths, slots = _checked(layer, pool, x, cu_seqlens, slots)
    out, trace, states = _run(layer, pool, x, cu_seqlens, seq_pos, slots, [[int(n)] for n in lengths])
    for i, slot in enumerate(slots.tolist()):
        if slot != PAD_SLOT_ID:
            _put(pool, slot, states[i][int(lengths[i])])
    return out, trace


def prefix_snapshots(layer, pool, x, cu_seqlens, seq_pos, slots, snap_seq, snap_offset, snap_slot):
    x, cu_seqlens, lengths, slots = _checked(layer, pool, x, cu_seqlens, slots)
    snap_seq, snap_offset, snap_slot = check_snapshot_requests(snap_seq, snap_offset, snap_slot, lengths, slots,
                                                               len(pool.seq_len), getattr(layer, "layer_index", None))
    cuts = [sorted({int(n)} | {int(o) for s, o in zip(snap_seq, snap_offset) if s == i})
            for i, n in enumerate(lengths)]
    out, trace, states = _run(layer, pool, x, cu_seqlens, seq_pos, slots, cuts)
    for i, slot in enumerate(slots.tolist()):
        if slot != PAD_SLOT_ID:
            _put(pool, slot, states[i][int(lengths[i])])
    for i, o, d in zip(snap_seq.tolist(), snap_offset.tolist(), snap_slot.tolist()):
        _put(pool, d, states[i][o])
    return out, trace


@dataclass
class PlainSpec:
    pool: Any
    slots: np.ndarray
    lengths: np.ndarray
    steps: list[dict[int, Any]] = field(default_factory=list)  # per sequence {j: state after j tokens}
    verify: np.ndarray | None = None  # a mixed call's verify rows (None: every row)


def verify_spec(layer, pool, x, cu_seqlens, seq_pos, slots):
    x, cu_seqlens, lengths, slots = _checked(layer, pool, x, cu_seqlens, slots)
    out, trace, states = _run(layer, pool, x, cu_seqlens, seq_pos, slots,
                              [list(range(1, int(n) + 1)) for n in lengths])
    return out, trace, PlainSpec(pool, slots, lengths, states)


def forward_mixed(layer, pool, x, cu_seqlens, seq_pos, slots, verify):
    x, cu_seqlens, lengths, slots = _checked(layer, pool, x, cu_seqlens, slots)
    rows = check_verify_rows(verify, lengths.shape[0], getattr(layer, "layer_index", None))
    cuts = [list(range(1, int(n) + 1)) if v else [int(n)] for n, v in zip(lengths, rows)]
    out, trace, states = _run(layer, pool, x, cu_seqlens, seq_pos, slots, cuts)
    for i, slot in enumerate(slots.tolist()):
        if slot != PAD_SLOT_ID and not rows[i]:
            _put(pool, slot, states[i][int(lengths[i])])
    return out, trace, PlainSpec(pool, slots, lengths, states, rows)


def commit(spec: PlainSpec, accepted, snap_seq=(), snap_offset=(), snap_slot=()) -> None:
    accepted = check_accepted(accepted, spec.lengths, None, spec.verify)
    snaps = check_commit_snapshots(snap_seq, snap_offset, snap_slot, accepted, spec.slots, len(spec.pool.seq_len), None)
    for i, slot in enumerate(spec.slots.tolist()):
        n = int(accepted[i])
        if slot != PAD_SLOT_ID and n > 0:
            _put(spec.pool, slot, spec.steps[i][n])
    for i, o, d in zip(*(a.tolist() for a in snaps)):
        _put(spec.pool, d, spec.steps[i][o])
