"""Mutants of the serving patterns (issue 14 item 7; docs/serving.md): the correct emulated layer,
whose packed calls run as plain calls on one-row copies of their slots
(`gdncheck.harness.plain_serving`), with one bookkeeping bug each — the bugs serving ports have
(`conv_window_leaks`, `chunk_straddles`, `slot_read_i_written_j`, `padding_slot_written`,
`commit_off_by_one`, `snapshot_chunk_late`, `prefill_as_verify_K`) — and four misreadings of the contract
(`SERVING_MISREADINGS`: `commit_writes_reset`, `snapshot_seq_len_offset`, `free_noop`,
`free_keeps_seq_len`).

Each is a `ServingMutant`, run by the kill matrix on the cases tagged with its `case_tags`, and a
plug-in factory (`gdncheck run gdncheck.conformance.meta.serving_mutants:NAME`).

Each bug, one line: docs/meta.md, "The serving mutants".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from gdncheck.calls import PAD_SLOT_ID
from gdncheck.conformance.earn.emulate import EmulatedLayer, emulated_adapter
from gdncheck.harness import plain_serving as plain

from .mutants import Mutant

MODULE = "gdncheck.conformance.meta.serving_mutants"
CHUNK = 64  # the chunk of the stream a chunked kernel would cut


def _run_carrying(layer, pool, x, cu, pos, slots, carry_conv: bool, carry_rec) -> tuple:
    """Plain calls, each sequence's one-row state taking the conv window (``carry_conv``) and/or, when
    ``carry_rec(i)``, the recurrent state the sequence before it left."""
    x = np.asarray(x)
    pieces, finals, prev = [], [], None
    for i in range(len(slots)):
        one = plain._row(layer, pool, int(slots[i]))
        if prev is not None and carry_conv:
            one.conv_state[0] = prev.conv_state[0]
        if prev is not None and carry_rec(i):
            one.recurrent_state[0] = prev.recurrent_state[0]
        pieces.append(layer.forward(x[None, cu[i]:cu[i + 1]], one, np.array([pos[i]])))
        finals.append(one)
        prev = one
    for i, slot in enumerate(np.asarray(slots).tolist()):
        if slot != PAD_SLOT_ID:
            plain._put(pool, slot, finals[i])
    return plain._cat(pieces)


def _leaky_forward(layer, pool, x, cu, pos, slots):
    return _run_carrying(layer, pool, x, cu, pos, slots, True, lambda i: False)


def _straddling_forward(layer, pool, x, cu, pos, slots):
    return _run_carrying(layer, pool, x, cu, pos, slots, False, lambda i: int(cu[i]) % CHUNK != 0)


def _rotated_forward(layer, pool, x, cu, pos, slots):
    """Reads slots[i], writes slots[i + 1] (the real slots rotated by one)."""
    real = [s for s in np.asarray(slots).tolist() if s != PAD_SLOT_ID]
    rotate = dict(zip(real, real[1:] + real[:1]))
    lengths = np.diff(cu)
    out, trace, states = plain._run(layer, pool, x, cu, pos, slots, [[int(n)] for n in lengths])
    for i, slot in enumerate(np.asarray(slots).tolist()):
        if slot != PAD_SLOT_ID:
            plain._put(pool, rotate[slot], states[i][int(lengths[i])])
    return out, trace


def _padding_written_forward(layer, pool, x, cu, pos, slots):
    lengths = np.diff(cu)
    out, trace, states = plain._run(layer, pool, x, cu, pos, slots, [[int(n)] for n in lengths])
    for i, slot in enumerate(np.asarray(slots).tolist()):
        plain._put(pool, slot if slot != PAD_SLOT_ID else pool.batch - 1, states[i][int(lengths[i])])
    return out, trace


def _commit_off_by_one(spec, accepted, *snaps) -> None:
    before = {f: getattr(spec.pool, f).copy() for f in plain.STATE_FIELDS}
    plain.commit(spec, accepted, *snaps)  # checks, snapshots; the slots set below
    for i, slot in enumerate(spec.slots.tolist()):
        n = int(accepted[i])
        if slot == PAD_SLOT_ID or n == 0:
            continue
        kept = spec.steps[i].get(n - 1)  # None for n = 1: the slot stays as it was
        if kept is not None:
            plain._put(spec.pool, slot, kept)
        else:
            for f in ("conv_state", "recurrent_state"):
                getattr(spec.pool, f)[slot] = before[f][slot]
        spec.pool.seq_len[slot] = spec.steps[i][n].seq_len[0]  # seq_pos + n, as the contract says


def _commit_counting(spec, accepted, count, snap_seq=(), snap_offset=(), snap_slot=()) -> None:
    """commit with each accepted count n read as ``count(n, window)`` (the state after that many
    tokens, seq_len to match: a consistent but wrong commit); its snapshots right."""
    plain.commit(spec, accepted, snap_seq, snap_offset, snap_slot)  # checks, the snapshots
    for i, slot in enumerate(spec.slots.tolist()):
        n = count(int(accepted[i]), int(spec.lengths[i]))
        if slot != PAD_SLOT_ID and n > 0 and (spec.verify is None or spec.verify[i]):
            plain._put(spec.pool, slot, spec.steps[i][n])


def _commit_one_late(spec, accepted, *snaps) -> None:
    """commit(n) keeps the state after n + 1 tokens (the window's last at most): the accepted count
    read as the index of the last accepted token plus one more (the bonus token counted)."""
    _commit_counting(spec, accepted, lambda n, window: min(n + 1, window) if n > 0 else 0, *snaps)


def _commit_capped_4(spec, accepted, *snaps) -> None:
    """commit(n) keeps the state after min(n, 4) tokens (a kernel built for drafts of at most 4)."""
    _commit_counting(spec, accepted, lambda n, window: min(n, 4), *snaps)


def _mixed_plain_rows_from_zero(layer, pool, x, cu, pos, slots, verify):
    """A mixed call gathers the verify rows' states from their slots and runs the plain rows from a
    zero state (the gather built for the speculative rows only); the plain rows' slots are written."""
    from gdncheck.calls import check_verify_rows

    x, cu, lengths, slots = plain._checked(layer, pool, x, cu, slots)
    rows = check_verify_rows(verify, lengths.shape[0], getattr(layer, "layer_index", None))
    read = np.where(np.asarray(rows, dtype=bool), slots, PAD_SLOT_ID)
    cuts = [list(range(1, int(n) + 1)) if v else [int(n)] for n, v in zip(lengths, rows)]
    out, trace, states = plain._run(layer, pool, x, cu, pos, read, cuts)
    for i, slot in enumerate(slots.tolist()):
        if slot != PAD_SLOT_ID and not rows[i]:
            plain._put(pool, slot, states[i][int(lengths[i])])
    return out, trace, plain.PlainSpec(pool, slots, lengths, states, rows)


def _free_keeping_conv_state(pool, slots) -> None:
    """The recurrent state and seq_len zeroed, the conv window kept: the next request in the slot
    starts from the old request's last K columns."""
    for s in np.asarray(slots, dtype=np.int64).tolist():
        pool.recurrent_state[s] = 0
        pool.seq_len[s] = 0


def _late_snapshots(layer, pool, x, cu, pos, slots, snap_seq, snap_offset, snap_slot):
    lengths = np.diff(cu)
    late = np.minimum(np.asarray(snap_offset) + CHUNK, lengths[np.asarray(snap_seq)])
    cuts = [sorted({int(n)} | {int(o) for s, o in zip(snap_seq, late) if s == i}) for i, n in enumerate(lengths)]
    out, trace, states = plain._run(layer, pool, x, cu, pos, slots, cuts)
    for i, slot in enumerate(np.asarray(slots).tolist()):
        if slot != PAD_SLOT_ID:
            plain._put(pool, slot, states[i][int(lengths[i])])
    for i, o, late_o, d in zip(np.asarray(snap_seq).tolist(), np.asarray(snap_offset).tolist(), late.tolist(),
                               np.asarray(snap_slot).tolist()):
        plain._put(pool, d, states[i][late_o])
        pool.seq_len[d] = pos[i] + o  # the bookkeeping is right; the state is a chunk late
    return out, trace


def _plain_rows_kept_back(pool, slots, lengths, plain_rows, window: int):
    """The pool entries of the plain rows of exactly ``window`` tokens, as they were before the call."""
    return {s: {f: np.copy(getattr(pool, f)[s]) for f in plain.STATE_FIELDS}
            for s, n, p in zip(np.asarray(slots).tolist(), np.asarray(lengths).tolist(), plain_rows)
            if p and s != PAD_SLOT_ID and int(n) == window}


def _put_back(pool, kept) -> None:
    for s, fields in kept.items():
        for f, v in fields.items():
            getattr(pool, f)[s] = v


def _verify_sized_packed(drafts: int):
    """forward_packed where a sequence of exactly 1 + ``drafts`` tokens is dispatched as a speculative
    verify window (vLLM issue 53051: a prefill of that length classified as a decode/verify by its
    token count): its outputs right, its slot left for a commit that never comes (state and seq_len
    as before the call)."""
    def forward_packed(layer, pool, x, cu, pos, slots):
        kept = _plain_rows_kept_back(pool, slots, np.diff(np.asarray(cu)), [True] * len(slots), 1 + drafts)
        out, trace = plain.forward_packed(layer, pool, x, cu, pos, slots)
        _put_back(pool, kept)
        return out, trace
    return forward_packed


def _verify_sized_mixed(drafts: int):
    """forward_mixed with the same dispatch: a plain row of exactly 1 + ``drafts`` tokens not written."""
    def forward_mixed(layer, pool, x, cu, pos, slots, verify):
        rows = [not bool(v) for v in np.asarray(verify).tolist()]
        kept = _plain_rows_kept_back(pool, slots, np.diff(np.asarray(cu)), rows, 1 + drafts)
        out, trace, spec = plain.forward_mixed(layer, pool, x, cu, pos, slots, verify)
        _put_back(pool, kept)
        return out, trace, spec
    return forward_mixed


@dataclass
class _ResetSpec(plain.PlainSpec):
    """A verify's steps, and which of its sequences' slots the seq-len rule read as zeros."""

    seq_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    was_reset: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))


def _verify_noting_resets(layer, pool, x, cu, pos, slots):
    ids = np.asarray(slots)
    pos = np.broadcast_to(np.asarray(pos, dtype=np.int64), ids.shape)
    seen = np.array([int(pool.seq_len[s]) if s != PAD_SLOT_ID else p for s, p in zip(ids.tolist(), pos.tolist())])
    out, trace, spec = plain.verify_spec(layer, pool, x, cu, pos, slots)
    return out, trace, _ResetSpec(spec.pool, spec.slots, spec.lengths, spec.steps, seq_pos=pos.copy(),
                                  was_reset=(ids != PAD_SLOT_ID) & (seen != pos))


def _commit_writing_reset(spec: _ResetSpec, accepted, *snaps) -> None:
    """commit(n >= 1) right; commit(0) of a slot the verify read as zeros writes those zeros, at
    seq_len = seq_pos (the state "after 0 tokens" of the reading). A mixed call's commit is right
    (the bug lives in verify_spec's bookkeeping, which a forward_mixed does not go through)."""
    plain.commit(spec, accepted, *snaps)
    if not isinstance(spec, _ResetSpec):
        return
    for i, slot in enumerate(spec.slots.tolist()):
        if slot != PAD_SLOT_ID and int(accepted[i]) == 0 and spec.was_reset[i]:
            spec.pool.conv_state[slot] = 0
            spec.pool.recurrent_state[slot] = 0
            spec.pool.seq_len[slot] = spec.seq_pos[i]


def _snapshots_at_offset(layer, pool, x, cu, pos, slots, snap_seq, snap_offset, snap_slot):
    """The right states; each destination's seq_len the offset alone."""
    out, trace = plain.prefix_snapshots(layer, pool, x, cu, pos, slots, snap_seq, snap_offset, snap_slot)
    for o, d in zip(np.asarray(snap_offset).tolist(), np.asarray(snap_slot).tolist()):
        pool.seq_len[d] = o
    return out, trace


def _free_noop(pool, slots) -> None:
    """Nothing freed: the slot keeps its state and its seq_len."""


def _free_keeping_seq_len(pool, slots) -> None:
    """Both states zeroed, the seq_len kept."""
    for s in np.asarray(slots, dtype=np.int64).tolist():
        pool.conv_state[s] = 0
        pool.recurrent_state[s] = 0


def _serving(**overrides) -> SimpleNamespace:
    """plain_serving's four patterns with some replaced (and ``free``, the harness's, when given)."""
    base = {n: getattr(plain, n) for n in ("forward_packed", "prefix_snapshots", "verify_spec", "commit",
                                           "forward_mixed")}
    return SimpleNamespace(**{**base, **overrides})


@dataclass(frozen=True)
class ServingMutant(Mutant):
    """A :class:`~.mutants.Mutant` of the serving bookkeeping: the correct emulated layer with a buggy
    ``serving`` module, shown only by cases with ``case_tags``."""

    serving: SimpleNamespace | None = field(default=None, compare=False)  # not hashed: a namespace of functions
    case_tags: tuple[str, ...] = ("packed",)
    module: str = MODULE

    def factory(self, cfg, weights, *, profile: str = "f32", strict: bool = False, placement: str = "hf", **kw):
        layer = EmulatedLayer(cfg, weights, profile=profile, placement=placement, strict=strict, **kw)
        adapter = emulated_adapter(layer, f"mutant {self.name} ({profile}, placement {placement})")
        adapter._serving = self.serving
        free = getattr(self.serving, "free", None)
        if free is not None:  # the harness's free (a reset of the rows) replaced by the mutant's
            adapter.free = free
        return adapter


SERVING_MUTANTS: tuple[ServingMutant, ...] = (
    ServingMutant("conv_window_leaks", EmulatedLayer, "conv1d", bug_class="conv window leaks across a packed boundary",
                  serving=_serving(forward_packed=_leaky_forward)),
    ServingMutant("chunk_straddles", EmulatedLayer, "delta_rule", bug_class="chunks straddle two sequences",
                  serving=_serving(forward_packed=_straddling_forward)),
    ServingMutant("slot_read_i_written_j", EmulatedLayer, "conv1d", bug_class="state read from slot i, written to j",
                  serving=_serving(forward_packed=_rotated_forward), case_tags=("packed", "slots")),
    ServingMutant("padding_slot_written", EmulatedLayer, "conv1d", bug_class="padding slot written",
                  serving=_serving(forward_packed=_padding_written_forward), case_tags=("packed", "slots")),
    ServingMutant("commit_off_by_one", EmulatedLayer, "conv1d", bug_class="commit off by one token",
                  serving=_serving(commit=_commit_off_by_one), case_tags=("spec-decode",)),
    ServingMutant("snapshot_chunk_late", EmulatedLayer, "conv1d", bug_class="prefix snapshot one chunk late",
                  serving=_serving(prefix_snapshots=_late_snapshots), case_tags=("prefix-cache",)),
    # the state-handling classes real engines have shipped (issue 36 item 5)
    ServingMutant("commit_one_late", EmulatedLayer, "conv1d", bug_class="commit one token late (n + 1 kept)",
                  serving=_serving(commit=_commit_one_late), case_tags=("spec-decode",)),
    ServingMutant("commit_capped_4", EmulatedLayer, "conv1d", bug_class="commit's accepted count capped at 4",
                  serving=_serving(commit=_commit_capped_4), case_tags=("spec-decode",)),
    ServingMutant("mixed_plain_rows_from_zero", EmulatedLayer, "conv1d",
                  bug_class="mixed batch: plain rows' states not gathered (run from zeros)",
                  serving=_serving(forward_mixed=_mixed_plain_rows_from_zero), case_tags=("mixed-batch",)),
    ServingMutant("free_keeps_conv_state", EmulatedLayer, "conv1d", ("packed-mixed", 3),
                  bug_class="stale conv state on a new request (state handling)",
                  serving=_serving(free=_free_keeping_conv_state), case_tags=("packed", "slots")),
    # a prefill of exactly 1 + the draft count dispatched as a verify window (issue 44 item 2; vLLM issue
    # 53051), for the draft counts 1-4 engines run with
    *(ServingMutant(f"prefill_as_verify_{k}", EmulatedLayer, "conv1d",
                    bug_class=f"a prefill of 1 + {k} tokens dispatched as a {k}-draft verify (slot not written)",
                    serving=_serving(forward_packed=_verify_sized_packed(k), forward_mixed=_verify_sized_mixed(k)),
                    case_tags=("packed",))
      for k in (1, 2, 3, 4)),
)

#: Misreadings of the contract (module docstring), each first seen at ``stage`` in call ``call[1]`` of
#: the recipe ``call[0]``: the pool's conv state (stage conv1d) where a state is wrong, the pool's
#: seq_len (the pseudo-stage ``state``, an exact check) where only the bookkeeping is.
SERVING_MISREADINGS: tuple[ServingMutant, ...] = (
    ServingMutant("commit_writes_reset", EmulatedLayer, "conv1d", ("spec-decode", 7),
                  bug_class="commit(0) writes the reset a mismatched slot was read with",
                  serving=_serving(verify_spec=_verify_noting_resets, commit=_commit_writing_reset),
                  case_tags=("spec-decode",)),
    ServingMutant("snapshot_seq_len_offset", EmulatedLayer, "state", ("prefix-cache", 2),
                  bug_class="prefix snapshot seq_len = offset, not seq_pos + offset",
                  serving=_serving(prefix_snapshots=_snapshots_at_offset), case_tags=("prefix-cache",)),
    ServingMutant("free_noop", EmulatedLayer, "conv1d", ("packed-mixed", 3), bug_class="free does nothing",
                  serving=_serving(free=_free_noop), case_tags=("packed", "slots")),
    ServingMutant("free_keeps_seq_len", EmulatedLayer, "state", ("packed-mixed", 3),
                  bug_class="free keeps the slot's seq_len",
                  serving=_serving(free=_free_keeping_seq_len), case_tags=("packed", "slots")),
)
SERVING_MUTANT_BY_NAME = {m.name: m for m in SERVING_MUTANTS + SERVING_MISREADINGS}

# module-level factories, so that `gdncheck run gdncheck.conformance.meta.serving_mutants:NAME` works
globals().update({m.name: m.factory for m in SERVING_MUTANTS + SERVING_MISREADINGS})
