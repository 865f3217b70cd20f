"""The call contract every implementation keeps (docs/spec.md §4): input checks and the seq_pos rule, and for
the serving patterns (docs/serving.md) the padding slot id, the names of the patterns and their checks.

Neutral bookkeeping, no math: the reference, the Triton path and the precision-emulating layer all
call these, so a call is refused, or a state reset, by the same rule and with the same message in
each (tests/test_call_contract.py runs the contract over every one of them).
"""

from __future__ import annotations

import logging

import numpy as np

from .config import GDNConfig
from .errors import (
    AcceptCountError,
    BatchSizeError,
    CuSeqlensError,
    DuplicateSlotError,
    EmptySequenceError,
    InputDtypeError,
    InputError,
    InputShapeError,
    SeqPosMismatchError,
    SlotIndexError,
    SnapshotRequestError,
)


def check_x(shape: tuple[int, ...], is_real_float: bool, dtype, cfg: GDNConfig, batch: int,
            layer: int | None, accepted: str = "float16/32/64") -> None:
    """x must be a real floating array of shape [B, T >= 1, D]."""
    if not is_real_float:
        raise InputDtypeError(f"expected x of a real floating dtype ({accepted}), found {dtype}", layer=layer)
    D = cfg.hidden_size
    if len(shape) != 3 or shape[2] != D or shape[1] < 1 or shape[0] != batch:
        raise InputShapeError(f"expected x of shape [B={batch}, T>=1, D={D}], found {list(shape)}", layer=layer)


def check_state(state_cfg: GDNConfig, cfg: GDNConfig, layer: int | None) -> None:
    """A state made for a layer of these dimensions (the state fingerprint of docs/spec.md §4)."""
    if state_cfg.state_fingerprint() != cfg.state_fingerprint():
        def dims(c: GDNConfig) -> str:
            return f"Hk={c.num_k_heads} Hv={c.num_v_heads} dk={c.head_k_dim} dv={c.head_v_dim} K={c.conv_kernel}"

        raise InputError(f"expected a state of this layer's dimensions ({dims(cfg)}), found one made for "
                         f"{dims(state_cfg)}", layer=layer)


#: The largest position (``seq_pos``, a state's ``seq_len``) a call takes: far beyond any context a model
#: holds (Qwen3.5's is 2^18 tokens), and small enough that ``seq_pos + T`` stays an exact int64 (a position
#: of 2^63 overflowed NumPy's int64 inside the reference: an ``OverflowError``, not a refusal).
MAX_POSITION = 1 << 48


def check_seq_pos(seq_pos, pos: np.ndarray, batch: int, layer: int | None) -> np.ndarray:
    """``seq_pos`` (as given, for messages) and its NumPy form -> int64 positions [B], each in
    ``0 … MAX_POSITION``."""
    if pos.dtype.kind not in "iu" or (pos.ndim == 1 and pos.shape[0] != batch) or pos.ndim > 1:
        raise InputShapeError(
            f"expected seq_pos as an int or {batch} ints (one per sequence), found {_cut(seq_pos)}", layer=layer
        )
    if (pos < 0).any():
        raise InputError(f"expected seq_pos >= 0, found {_cut(seq_pos)}", layer=layer)
    if (pos > MAX_POSITION).any():
        raise InputError(f"expected seq_pos <= {MAX_POSITION} (gdncheck's bound on a position), found "
                         f"{_cut(seq_pos)}", layer=layer)
    return np.broadcast_to(pos.astype(np.int64), (batch,)).copy()


def _cut(values) -> str:
    """``repr(values)`` cut to one short line (a message quotes what it found, never megabytes)."""
    text = repr(values)
    return text if len(text) <= 200 else text[:200] + f"... ({len(text)} characters)"


def rows_to_reset(pos: np.ndarray, seq_len: np.ndarray, *, strict: bool, warned: bool, layer: int | None,
                  logger: logging.Logger) -> tuple[np.ndarray, bool]:
    """The seq_pos rule: rows whose state ``seq_len`` differs from the call's ``seq_pos``.

    Strict mode raises :class:`SeqPosMismatchError` (the caller has changed nothing yet). Otherwise
    a warning is logged the first time for this state (``warned`` False) and the caller resets the
    returned rows to zeros. Returns ``(rows mask, warned after this call)``.
    """
    mismatch = pos != seq_len
    if not mismatch.any():
        return mismatch, warned
    rows = np.flatnonzero(mismatch).tolist()
    detail = ", ".join(f"row {r}: state seq_len={seq_len[r]}, seq_pos={pos[r]}" for r in rows[:4])
    if strict:
        raise SeqPosMismatchError(f"expected seq_pos equal to the state's seq_len, found {detail}", layer=layer)
    if not warned:
        logger.warning("linear_attention state mismatch at layer %s: %s. Resetting the state of row(s) %s.",
                       layer, detail, rows)
    return mismatch, True


# --- serving calls (docs/serving.md): packed sequences, slots of a state pool, speculative verify ---

#: The slot id of a padding sequence: its tokens are computed from a zero state, and no pool slot is
#: read or written for it. -1 is vLLM's and SGLang's ``PAD_SLOT_ID``; it lies outside ``[0, S)`` for
#: every pool size. (In Python and NumPy -1 is also a valid index, the last slot: test for it first.)
PAD_SLOT_ID = -1

#: The serving patterns by name (the reference's functions in ``reference/serving.py``, and the program
#: ops of fixtures), each with the per-call fields it takes besides ``x [total_tokens, D]``.
SERVING_OPS: dict[str, tuple[str, ...]] = {
    "forward_packed": ("cu_seqlens", "seq_pos", "slots"),
    "prefix_snapshots": ("cu_seqlens", "seq_pos", "slots", "snap_seq", "snap_offset", "snap_slot"),
    "verify_spec": ("cu_seqlens", "seq_pos", "slots"),
    "commit": ("accepted", "snap_seq", "snap_offset", "snap_slot"),  # the snapshot requests optional
    # a batch as engines schedule it: speculative-verify rows (``verify[i]`` 1) beside plain prefill and
    # decode rows (0); a verify of its verify rows, a packed call of the others
    "forward_mixed": ("cu_seqlens", "seq_pos", "slots", "verify"),
}

#: What a speculative verify keeps for its commit: the state after every token, packed by token like
#: the stage tensors (row ``cu_seqlens[i] + j - 1`` is sequence i after its first j tokens).
SPEC_STEP_TENSORS: tuple[str, ...] = ("conv_state_steps", "recurrent_state_steps")


def _ints(values, n: int | None, what: str, layer: int | None) -> np.ndarray:
    """``values`` as int64 [n] (any n when None); refused unless a 1-D integer array (an empty list is one)."""
    arr = np.asarray(values)
    if arr.size == 0 and arr.ndim == 1:
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu" or arr.ndim != 1 or (n is not None and arr.shape[0] != n):
        count = "a 1-D integer array" if n is None else f"{n} ints (one per sequence)"
        raise InputShapeError(f"expected {what} as {count}, found {values!r}", layer=layer)
    return arr.astype(np.int64)


def check_packed_x(shape: tuple[int, ...], is_real_float: bool, dtype, cfg: GDNConfig, layer: int | None,
                   accepted: str = "float16/32/64") -> None:
    """A packed x must be a real floating array of shape [total_tokens >= 1, D]."""
    if not is_real_float:
        raise InputDtypeError(f"expected x of a real floating dtype ({accepted}), found {dtype}", layer=layer)
    D = cfg.hidden_size
    if len(shape) != 2 or shape[1] != D or shape[0] < 1:
        raise InputShapeError(f"expected packed x of shape [total_tokens>=1, D={D}], found {list(shape)}",
                              layer=layer)


def check_cu_seqlens(cu_seqlens, total: int, layer: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``cu_seqlens`` [N + 1]: starts at 0, never decreases, ends at ``total``; no sequence is empty.

    Returns the offsets and the lengths [N] as int64.
    """
    cu = np.asarray(cu_seqlens)
    if cu.dtype.kind not in "iu" or cu.ndim != 1 or cu.shape[0] < 2:
        raise CuSeqlensError(f"expected cu_seqlens as a 1-D integer array of N + 1 >= 2 offsets, found "
                             f"{cu_seqlens!r}", layer=layer)
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        raise CuSeqlensError(f"expected cu_seqlens[0] = 0, found {cu[0]}", layer=layer)
    lengths = np.diff(cu)
    if (lengths < 0).any():
        i = int(np.flatnonzero(lengths < 0)[0])
        raise CuSeqlensError(f"expected non-decreasing cu_seqlens, found cu_seqlens[{i}]={cu[i]} > "
                             f"cu_seqlens[{i + 1}]={cu[i + 1]}", layer=layer)
    if cu[-1] != total:
        raise CuSeqlensError(f"expected cu_seqlens[-1] = total_tokens = {total} (x's first axis), found "
                             f"{cu[-1]}", layer=layer)
    if (lengths == 0).any():
        empty = np.flatnonzero(lengths == 0).tolist()
        raise EmptySequenceError(f"expected every packed sequence to hold >= 1 token, found sequence(s) {empty} "
                                 f"empty in cu_seqlens={cu.tolist()}", layer=layer)
    return cu, lengths


def check_slots(slots, n: int, pool_size: int, layer: int | None) -> np.ndarray:
    """Slot ids [N]: each the padding id or in ``[0, pool_size)``, real ones distinct. Returns int64 [N]."""
    ids = _ints(slots, n, "slots", layer)
    bad = (ids != PAD_SLOT_ID) & ((ids < 0) | (ids >= pool_size))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SlotIndexError(f"expected slot ids in [0, {pool_size}) (the pool's size) or the padding id "
                             f"{PAD_SLOT_ID}, found slot {ids[i]} for sequence {i}", layer=layer)
    _check_distinct(ids, [f"sequence {i}" for i in range(n)], layer)
    return ids


def check_free_slots(slots, pool_size: int, layer: int | None) -> np.ndarray:
    """``free``: the slots of finished requests, each in ``[0, pool_size)``. The padding id is refused
    too: it names no slot (a padding sequence has none to free), and in Python and NumPy it would
    index the last slot. A slot may be named twice (freeing is idempotent). Returns int64 [M]."""
    ids = _ints(np.atleast_1d(np.asarray(slots)) if np.ndim(slots) == 0 else slots, None, "slots to free", layer)
    bad = (ids < 0) | (ids >= pool_size)
    if bad.any():
        m = int(np.flatnonzero(bad)[0])
        what = " (the padding id names no slot)" if ids[m] == PAD_SLOT_ID else ""
        raise SlotIndexError(f"expected slots to free in [0, {pool_size}) (the pool's size), found slot {ids[m]}"
                             f"{what} at entry {m}", layer=layer)
    return ids


def _check_distinct(ids: np.ndarray, owners: list[str], layer: int | None) -> None:
    first: dict[int, str] = {}
    for slot, owner in zip(ids.tolist(), owners):
        if slot == PAD_SLOT_ID:
            continue
        if slot in first:
            raise DuplicateSlotError(f"expected each pool slot named at most once per call (the padding id "
                                     f"{PAD_SLOT_ID} may repeat), found slot {slot} for {first[slot]} and "
                                     f"{owner}", layer=layer)
        first[slot] = owner


def slots_to_reset(pos: np.ndarray, slots: np.ndarray, slot_seq_len: np.ndarray, *, strict: bool, warned: bool,
                   layer: int | None, logger: logging.Logger) -> tuple[np.ndarray, bool]:
    """The seq_pos rule per slot: the sequences whose slot's ``seq_len`` differs from their ``seq_pos``.

    Padding sequences never mismatch (they have no slot). Strict mode raises
    :class:`SeqPosMismatchError` (the caller has changed nothing yet); otherwise a warning is logged the
    first time for this pool. Returns ``(mask over sequences, warned after this call)``.
    """
    real = slots != PAD_SLOT_ID
    seen = np.where(real, slot_seq_len[np.where(real, slots, 0)], pos)  # never index with the padding id
    mismatch = real & (seen != pos)
    if not mismatch.any():
        return mismatch, warned
    seqs = np.flatnonzero(mismatch).tolist()
    detail = ", ".join(f"sequence {i} (slot {slots[i]}): slot seq_len={seen[i]}, seq_pos={pos[i]}" for i in seqs[:4])
    if strict:
        raise SeqPosMismatchError(f"expected seq_pos equal to the slot's seq_len, found {detail}", layer=layer)
    if not warned:
        logger.warning("linear_attention state mismatch at layer %s: %s. Resetting the state of slot(s) %s.",
                       layer, detail, slots[seqs].tolist())
    return mismatch, True


def check_accepted(accepted, lengths: np.ndarray, layer: int | None, verify: np.ndarray | None = None) -> np.ndarray:
    """``commit``: one accepted count per sequence, ``0 <= accepted[i] <= lengths[i]``; for a plain row of a
    mixed call (``verify[i]`` false) exactly 0: it has nothing to commit. Returns int64 [N]."""
    n = _ints(accepted, lengths.shape[0], "accepted", layer)
    bad = (n < 0) | (n > lengths)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AcceptCountError(f"expected 0 <= accepted <= k for each sequence, found accepted={n[i]} for "
                               f"sequence {i} (k={lengths[i]})", layer=layer)
    if verify is not None and ((n != 0) & ~verify).any():
        i = int(np.flatnonzero((n != 0) & ~verify)[0])
        raise AcceptCountError(f"expected accepted 0 for a plain (non-verify) row of a mixed call, found "
                               f"accepted={n[i]} for sequence {i}", layer=layer)
    return n


def check_verify_rows(verify, n: int, layer: int | None) -> np.ndarray:
    """``forward_mixed``: one flag per sequence, 1 (a speculative-verify row) or 0 (a plain prefill or
    decode row; booleans are taken too). Returns bool [N]."""
    arr = np.asarray(verify)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu" or arr.ndim != 1 or arr.shape[0] != n or not np.isin(arr, (0, 1)).all():
        raise InputShapeError(f"expected verify as {n} flags 0 or 1 (one per sequence), found {verify!r}",
                              layer=layer)
    return arr.astype(bool)


def check_commit_snapshots(snap_seq, snap_offset, snap_slot, accepted: np.ndarray, slots: np.ndarray,
                           pool_size: int, layer: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A commit's snapshot requests (docs/serving.md §4): sequence ``snap_seq[m]``'s state after
    ``snap_offset[m]`` of its *accepted* tokens goes to slot ``snap_slot[m]``; an offset in
    ``1..accepted[i]`` (a prefix cache keeps accepted tokens only), destinations as for
    :func:`check_snapshot_requests`. Returns the three as int64 [M]."""
    return check_snapshot_requests(snap_seq, snap_offset, snap_slot, accepted, slots, pool_size, layer,
                                   counted="accepted tokens")


def check_snapshot_requests(snap_seq, snap_offset, snap_slot, lengths: np.ndarray, slots: np.ndarray,
                            pool_size: int, layer: int | None, counted: str = "tokens"
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prefix-snapshot requests, M entries: sequence ``snap_seq[m]`` after ``snap_offset[m]`` of its tokens
    goes to pool slot ``snap_slot[m]``. Each names a real sequence, an offset in ``1..length``, no
    (sequence, offset) twice; destinations are real slots, distinct, and none of the call's slots.
    Returns the three as int64 [M].
    """
    seq = _ints(snap_seq, None, "snap_seq", layer)
    off = _ints(snap_offset, seq.shape[0], "snap_offset (one per snap_seq entry)", layer)
    dest = _ints(snap_slot, seq.shape[0], "snap_slot (one per snap_seq entry)", layer)
    n = lengths.shape[0]
    seen: set[tuple[int, int]] = set()
    for m, (i, o) in enumerate(zip(seq.tolist(), off.tolist())):
        if not 0 <= i < n:
            raise SnapshotRequestError(f"expected snap_seq in [0, {n}) (the call's sequences), found {i} at "
                                       f"request {m}", layer=layer)
        if slots[i] == PAD_SLOT_ID:
            raise SnapshotRequestError(f"expected a snapshot of a sequence with a slot, found request {m} for "
                                       f"padding sequence {i}", layer=layer)
        if not 1 <= o <= lengths[i]:
            raise SnapshotRequestError(f"expected snap_offset in 1..{lengths[i]} (sequence {i}'s {counted}), found "
                                       f"{o} at request {m}", layer=layer)
        if (i, o) in seen:
            raise SnapshotRequestError(f"expected each (sequence, offset) once, found sequence {i} offset {o} "
                                       f"twice (request {m})", layer=layer)
        seen.add((i, o))
    bad = (dest < 0) | (dest >= pool_size)
    if bad.any():
        m = int(np.flatnonzero(bad)[0])
        raise SlotIndexError(f"expected snapshot destination slots in [0, {pool_size}) (never the padding id), "
                             f"found slot {dest[m]} at request {m}", layer=layer)
    _check_distinct(np.concatenate([slots, dest]),
                    [f"sequence {i}" for i in range(n)] + [f"snapshot request {m}" for m in range(dest.shape[0])],
                    layer)
    return seq, off, dest


def check_batch(cfg: GDNConfig, batch, limit: int) -> int:
    """``new_state(batch)``'s ``batch`` as an int, refused (:class:`~gdncheck.errors.BatchSizeError`) unless a
    positive integer whose whole state (``B·(conv_dim·K + Hv·dk·dv)`` elements) stays within ``limit``,
    checked before anything is allocated. The reference and the Triton path each pass their own bound."""
    if isinstance(batch, bool) or not isinstance(batch, int | np.integer) or batch < 1:
        raise BatchSizeError(f"expected batch a positive integer, found {batch!r}")
    batch = int(batch)
    per_sequence = cfg.conv_dim * cfg.conv_kernel + cfg.num_v_heads * cfg.head_k_dim * cfg.head_v_dim
    if batch * per_sequence > limit:
        raise BatchSizeError(f"expected a batch whose state holds at most {limit} elements (at most "
                             f"{limit // per_sequence} sequences of {per_sequence}), found batch {batch} "
                             f"({batch * per_sequence} elements)")
    return batch
