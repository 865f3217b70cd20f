"""Serving-engine call patterns on the float64 reference: packed variable-length calls over a pool of
state slots, speculative verify and commit, prefix snapshots.

>>> pool = StatePool(cfg, size=16)            # conv [16, conv_dim, K], recurrent [16, Hv, dk, dv], seq_len [16]
>>> out, trace = forward_packed(layer, pool, x, cu_seqlens=[0, 1, 65], seq_pos=[40, 0], slots=[3, 7])
>>> out, trace, spec = verify_spec(layer, pool, x_draft, cu_seqlens=[0, 4, 8], seq_pos=[41, 64], slots=[3, 7])
>>> commit(spec, accepted=[2, 4])             # slot 3 as if it decoded 2 tokens, slot 7 all 4
>>> out, trace = prefix_snapshots(layer, pool, x, [0, 200], [0], [5], snap_seq=[0, 0], snap_offset=[64, 130],
...                               snap_slot=[8, 9])    # slots 8, 9 get the states after 64 and 130 tokens
>>> out, trace, spec = forward_mixed(layer, pool, x, cu_seqlens=[0, 1, 9, 49], seq_pos=[7, 30, 0],
...                                  slots=[2, 3, 4], verify=[0, 1, 0])   # a decode, 8 draft tokens, a prefill
>>> commit(spec, [0, 5, 0], snap_seq=[1], snap_offset=[3], snap_slot=[9])  # slot 3 keeps 5, slot 9 the first 3

Every function takes the reference `Layer` first and any `State` as the pool (`strict`,
`delta_rule`, `chunk_size` default to the layer's). `x`, `out` and every trace tensor are
`[total_tokens, ...]`; slot −1 (`gdncheck.calls.PAD_SLOT_ID`) is a padding sequence; every input is
checked before anything is written. `verify_spec` writes no slot; `commit` does.

The contract, the errors and how a call runs: docs/serving.md §1-6, §8.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

from gdncheck.calls import (
    PAD_SLOT_ID,
    check_accepted,
    check_commit_snapshots,
    check_cu_seqlens,
    check_free_slots,
    check_packed_x,
    check_seq_pos,
    check_slots,
    check_snapshot_requests,
    check_verify_rows,
    slots_to_reset,
)
from gdncheck.config import GDNConfig
from gdncheck.errors import InputError, InputShapeError, SpecCommitError

from .conv1d import conv1d
from .delta_rule import delta_rule_recurrent
from .delta_rule_chunked import delta_rule_chunked
from .gated_norm import gated_norm
from .gates import gates
from .in_proj import in_proj
from .input_norm import input_norm
from .layer import DELTA_RULE_FORMS, Layer
from .mlp import mlp
from .out_proj import out_proj
from .post_norm import post_norm
from .qk_norm import qk_norm
from .residual import output, residual
from .state import State

log = logging.getLogger("gdncheck.reference")


class StatePool(State):
    """``size`` slots of layer state: conv_state [S, conv_dim, K], recurrent_state [S, Hv, dk, dv],
    seq_len [S]. A :class:`State` whose rows are slots (every serving function takes any State as a
    pool), zeros and ``seq_len = 0`` at first."""

    def __init__(self, cfg: GDNConfig, size: int):
        super().__init__(cfg, size)

    @property
    def size(self) -> int:
        return self.batch

    def free(self, slots) -> None:
        """Zero the given slots and set their seq_len to 0, both (a finished request; a strict engine
        does this before a slot takes a new request, which the seq-len rule would otherwise refuse).
        Every id must be a slot, in ``[0, size)``: the padding id is refused (``slot_index``), never
        taken for the last slot."""
        self.reset(check_free_slots(slots, self.size, None))

    def __repr__(self) -> str:
        return f"StatePool(size={self.size}, seq_len={self.seq_len.tolist()})"


@dataclass
class SpecVerify:
    """What :func:`verify_spec` keeps for :func:`commit`: the call's layout and the state after every
    token. Row ``cu_seqlens[i] + j - 1`` of the steps is sequence i after its first j tokens (padding
    sequences included: the states reached from zero, never committed)."""

    pool: State
    layer_index: int | None
    cu_seqlens: np.ndarray  # int64 [N + 1]
    seq_pos: np.ndarray  # int64 [N]
    slots: np.ndarray  # int64 [N]
    slot_seq_len: np.ndarray  # int64 [N]: each slot's seq_len when verified (-1 for padding)
    conv_state_steps: np.ndarray  # [total_tokens, conv_dim, K]
    recurrent_state_steps: np.ndarray  # [total_tokens, Hv, dk, dv]
    committed: bool = False
    verify: np.ndarray | None = None  # bool [N] of a forward_mixed call (its verify rows); None: every row

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.cu_seqlens)


@dataclass(frozen=True)
class _Call:
    """A checked call: x float64 [total, D], the layout, and the seq-len rule's verdict (nothing written)."""

    x: np.ndarray
    cu: np.ndarray
    lengths: np.ndarray
    pos: np.ndarray
    slots: np.ndarray
    reset: np.ndarray  # bool [N]: the slot is read as zeros
    warned: bool  # the pool's warned flag after this call
    delta_rule: str
    chunk_size: int


# --- the three patterns ----------------------------------------------------------------------------
def forward_packed(layer: Layer, pool: State, x, cu_seqlens, seq_pos, slots, *, strict: bool | None = None,
                   delta_rule: str | None = None, chunk_size: int | None = None
                   ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One packed call: each sequence as ``layer.forward`` on its slot. Returns ``(out, trace)``."""
    call = _prepare(layer, pool, x, cu_seqlens, seq_pos, slots, strict, delta_rule, chunk_size)
    out, trace, states = _compute(layer, pool, call, [[int(n)] for n in call.lengths])
    _write_final(pool, call, states)
    return out, trace


def prefix_snapshots(layer: Layer, pool: State, x, cu_seqlens, seq_pos, slots, snap_seq, snap_offset, snap_slot,
                     *, strict: bool | None = None, delta_rule: str | None = None, chunk_size: int | None = None
                     ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """:func:`forward_packed`, and for each request m the state of sequence ``snap_seq[m]`` after its first
    ``snap_offset[m]`` tokens written to slot ``snap_slot[m]``, with ``seq_len = seq_pos + offset``."""
    call = _prepare(layer, pool, x, cu_seqlens, seq_pos, slots, strict, delta_rule, chunk_size)
    seq, off, dest = check_snapshot_requests(snap_seq, snap_offset, snap_slot, call.lengths, call.slots,
                                             pool.batch, layer.layer_index)
    cuts = [sorted({int(n)} | {int(o) for s, o in zip(seq, off) if s == i}) for i, n in enumerate(call.lengths)]
    out, trace, states = _compute(layer, pool, call, cuts)
    _write_final(pool, call, states)
    for i, o, d in zip(seq.tolist(), off.tolist(), dest.tolist()):
        conv, rec = states[i][o]
        pool.conv_state[d], pool.recurrent_state[d], pool.seq_len[d] = conv, rec, call.pos[i] + o
    return out, trace


def verify_spec(layer: Layer, pool: State, x, cu_seqlens, seq_pos, slots, *, strict: bool | None = None,
                delta_rule: str | None = None, chunk_size: int | None = None
                ) -> tuple[np.ndarray, dict[str, np.ndarray], SpecVerify]:
    """Every draft token's output, and the state after each, without writing the pool (its warned flag
    aside). Returns ``(out, trace, spec)``; :func:`commit` ``(spec, accepted)`` writes the slots."""
    call = _prepare(layer, pool, x, cu_seqlens, seq_pos, slots, strict, delta_rule, chunk_size)
    out, trace, states = _compute(layer, pool, call, [list(range(1, int(n) + 1)) for n in call.lengths])
    pool.warned = call.warned
    spec = _spec(layer, pool, call, states, None)
    return out, trace, spec


def forward_mixed(layer: Layer, pool: State, x, cu_seqlens, seq_pos, slots, verify, *, strict: bool | None = None,
                  delta_rule: str | None = None, chunk_size: int | None = None
                  ) -> tuple[np.ndarray, dict[str, np.ndarray], SpecVerify]:
    """A serving batch as engines schedule it: the rows with ``verify[i]`` true are speculative-verify rows
    (as :func:`verify_spec`: no slot written, the state after every token kept), the others plain prefill
    and decode rows (as :func:`forward_packed`: their slots written). Returns ``(out, trace, spec)``;
    :func:`commit` ``(spec, accepted)`` commits the verify rows (a plain row's count is 0)."""
    call = _prepare(layer, pool, x, cu_seqlens, seq_pos, slots, strict, delta_rule, chunk_size)
    rows = check_verify_rows(verify, call.lengths.shape[0], layer.layer_index)
    cuts = [list(range(1, int(n) + 1)) if v else [int(n)] for n, v in zip(call.lengths, rows)]
    out, trace, states = _compute(layer, pool, call, cuts)
    spec = _spec(layer, pool, call, states, rows)
    plain = replace(call, slots=np.where(rows, PAD_SLOT_ID, call.slots))
    _write_final(pool, plain, states)  # the plain rows' slots (a verify row is padding to this write)
    return out, trace, spec


def commit(spec: SpecVerify, accepted, snap_seq=(), snap_offset=(), snap_slot=()) -> None:
    """Make each slot of a verify as if only its sequence's first ``accepted[i]`` tokens had been run
    (``seq_len = seq_pos + accepted``); ``accepted[i] = 0`` leaves the slot as it was. Once per verify;
    refused when a call since the verify moved one of its slots' seq_len. Snapshot request m writes
    sequence ``snap_seq[m]``'s state after ``snap_offset[m]`` (in ``1..accepted``) of its tokens to slot
    ``snap_slot[m]``, ``seq_len = seq_pos + offset`` (a prefix cache entry inside the accepted window)."""
    pool, where = spec.pool, spec.layer_index
    n = check_accepted(accepted, spec.lengths, where, spec.verify)
    seq, off, dest = check_commit_snapshots(snap_seq, snap_offset, snap_slot, n, spec.slots, pool.batch, where)
    if spec.committed:
        raise SpecCommitError("expected one commit per verify_spec, found this verify already committed",
                              layer=where)
    real = spec.slots != PAD_SLOT_ID
    if spec.verify is not None:  # a mixed call: its plain rows' slots were written by the call itself
        real = real & spec.verify
    now = np.where(real, pool.seq_len[np.where(real, spec.slots, 0)], -1)
    moved = np.flatnonzero(now != spec.slot_seq_len)
    if moved.size:
        i = int(moved[0])
        raise SpecCommitError(f"expected slot {spec.slots[i]} (sequence {i}) at the seq_len it had when verified "
                              f"({spec.slot_seq_len[i]}), found {now[i]}: another call moved it", layer=where)
    for i in np.flatnonzero(real & (n > 0)).tolist():
        row, slot = int(spec.cu_seqlens[i] + n[i] - 1), int(spec.slots[i])
        pool.conv_state[slot] = spec.conv_state_steps[row]
        pool.recurrent_state[slot] = spec.recurrent_state_steps[row]
        pool.seq_len[slot] = spec.seq_pos[i] + n[i]
    for i, o, d in zip(seq.tolist(), off.tolist(), dest.tolist()):
        row = int(spec.cu_seqlens[i] + o - 1)
        pool.conv_state[d], pool.recurrent_state[d] = spec.conv_state_steps[row], spec.recurrent_state_steps[row]
        pool.seq_len[d] = spec.seq_pos[i] + o
    spec.committed = True


def _spec(layer: Layer, pool: State, call: _Call, states, rows: np.ndarray | None) -> SpecVerify:
    """The steps of the verify rows (``rows``; None: every row) packed by token; a plain row's rows of the
    steps hold its final state only (never committed)."""
    cfg = layer.cfg
    total = call.x.shape[0]
    conv_steps = np.zeros((total, cfg.conv_dim, cfg.conv_kernel))
    rec_steps = np.zeros((total, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim))
    for i, start in enumerate(call.cu[:-1].tolist()):
        for j, (conv, rec) in states[i].items():
            conv_steps[start + j - 1], rec_steps[start + j - 1] = conv, rec
    real = call.slots != PAD_SLOT_ID
    if rows is not None:
        real = real & rows
    seen = np.where(real, pool.seq_len[np.where(real, call.slots, 0)], -1)
    return SpecVerify(pool, layer.layer_index, call.cu, call.pos, call.slots, seen, conv_steps, rec_steps,
                      verify=rows)


# --- checking, computing, writing ------------------------------------------------------------------
def _prepare(layer: Layer, pool: State, x, cu_seqlens, seq_pos, slots, strict: bool | None,
             delta_rule: str | None, chunk_size: int | None) -> _Call:
    """Every check of the call, and the seq-len rule's verdict; raises before anything is written."""
    where = layer.layer_index
    if not isinstance(pool, State):
        raise InputError(f"expected a reference State or StatePool as the pool, found {type(pool).__name__}",
                         layer=where)
    if pool.fingerprint != layer.cfg.state_fingerprint():
        raise InputShapeError(f"expected a pool of this layer's state dimensions ({layer.cfg.state_fingerprint()}), "
                              f"found {pool.fingerprint}", layer=where)
    arr = np.asarray(x)
    check_packed_x(arr.shape, arr.dtype.kind == "f", arr.dtype, layer.cfg, where)
    cu, lengths = check_cu_seqlens(cu_seqlens, arr.shape[0], where)
    n = lengths.shape[0]
    pos = check_seq_pos(seq_pos, np.asarray(seq_pos), n, where)
    ids = check_slots(slots, n, pool.batch, where)
    form = delta_rule or layer.delta_rule
    if form not in DELTA_RULE_FORMS:
        raise ValueError(f"delta_rule must be one of {DELTA_RULE_FORMS}, found {form!r}")
    strict = layer.strict if strict is None else strict
    reset, warned = slots_to_reset(pos, ids, pool.seq_len, strict=strict, warned=pool.warned, layer=where, logger=log)
    return _Call(arr.astype(np.float64), cu, lengths, pos, ids, reset, warned, form, chunk_size or layer.chunk_size)


def _compute(layer: Layer, pool: State, call: _Call, cuts: list[list[int]]
             ) -> tuple[np.ndarray, dict[str, np.ndarray], list[dict[int, tuple[np.ndarray, np.ndarray]]]]:
    """The layer over the packed stream. ``cuts[i]``: increasing token offsets of sequence i (its length
    last) whose state is wanted. Returns out, the trace, and per sequence {offset: (conv, recurrent)}."""
    cfg, p, eps = layer.cfg, layer.params, layer.cfg.rms_norm_eps
    x = call.x
    # the stages of layer_forward (reference/layer.py) in its order: a stage changed there changes here too
    # token-wise, the whole stream at once
    x_norm = input_norm(x, p["input_layernorm.weight"], eps)
    qkv, z, a, b = in_proj(x_norm, p["linear_attn.in_proj_qkv.weight"], p["linear_attn.in_proj_z.weight"],
                           p["linear_attn.in_proj_a.weight"], p["linear_attn.in_proj_b.weight"])
    g, beta = gates(a, b, p["linear_attn.A_log"], p["linear_attn.dt_bias"])
    entering = [_entering_state(pool, call, i) for i in range(call.lengths.shape[0])]
    # sequence-wise: the conv window restarts at every sequence, from that sequence's own history
    qkv_conv = np.empty(qkv.shape)
    conv_at: list[dict[int, np.ndarray]] = []
    for i, (conv, _) in enumerate(entering):
        conv_at.append({})
        for s, e, cut in _segments(call, cuts, i):
            y, c = conv1d(qkv[None, s:e], conv[None], p["linear_attn.conv1d.weight"])
            qkv_conv[s:e], conv = y[0], c[0]
            conv_at[i][cut] = conv
    q, k, v = qk_norm(qkv_conv, cfg.num_k_heads, cfg.head_k_dim, cfg.num_v_heads, cfg.head_v_dim)
    core = np.empty(v.shape)
    states: list[dict[int, tuple[np.ndarray, np.ndarray]]] = []
    for i, (_, S) in enumerate(entering):
        states.append({})
        for s, e, cut in _segments(call, cuts, i):
            o, S = _delta_rule(call, cfg, q[None, s:e], k[None, s:e], v[None, s:e], g[None, s:e],
                               beta[None, s:e], S[None])
            core[s:e], S = o[0], S[0]
            states[i][cut] = (conv_at[i][cut], S)
    # token-wise again
    core_gated = gated_norm(core, z, p["linear_attn.norm.weight"], eps)
    attn_out = out_proj(core_gated, p["linear_attn.out_proj.weight"])
    h = residual(x, attn_out)
    h_norm = post_norm(h, p["post_attention_layernorm.weight"], eps)
    mlp_out = mlp(h_norm, p["mlp.gate_proj.weight"], p["mlp.up_proj.weight"], p["mlp.down_proj.weight"])
    out = output(h, mlp_out)
    trace = {
        "x": x, "x_norm": x_norm, "qkv": qkv, "z": z, "a": a, "b": b, "qkv_conv": qkv_conv,
        "q": q, "k": k, "v": v, "g": g, "beta": beta, "core": core, "core_gated": core_gated,
        "attn_out": attn_out, "h": h, "h_norm": h_norm, "mlp_out": mlp_out, "out": out,
    }
    return out, trace, states


def _entering_state(pool: State, call: _Call, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Sequence i's (conv, recurrent) state before the call: a copy of its slot, or zeros for a padding
    sequence and for a slot the seq-len rule resets (never indexing the pool with the padding id)."""
    slot = int(call.slots[i])
    if slot == PAD_SLOT_ID or call.reset[i]:
        return np.zeros(pool.conv_state.shape[1:]), np.zeros(pool.recurrent_state.shape[1:])
    return pool.conv_state[slot].copy(), pool.recurrent_state[slot].copy()


def _segments(call: _Call, cuts: list[list[int]], i: int):
    """(start, end, cut) rows of the packed stream, one per segment of sequence i between its cuts."""
    start, prev = int(call.cu[i]), 0
    for cut in cuts[i]:
        yield start + prev, start + cut, cut
        prev = cut


def _delta_rule(call: _Call, cfg: GDNConfig, q, k, v, g, beta, S):
    """The layer's choice of form (``auto``: recurrent for one token, chunked otherwise)."""
    T = q.shape[1]
    form = ("recurrent" if T == 1 else "chunked") if call.delta_rule == "auto" else call.delta_rule
    if form == "recurrent":
        return delta_rule_recurrent(q, k, v, g, beta, S, cfg.scale)
    return delta_rule_chunked(q, k, v, g, beta, S, cfg.scale, call.chunk_size)


def _write_final(pool: State, call: _Call, states: list[dict[int, tuple[np.ndarray, np.ndarray]]]) -> None:
    """Scatter each real sequence's final state to its slot: ``seq_len = seq_pos + length``."""
    for i, slot in enumerate(call.slots.tolist()):
        if slot == PAD_SLOT_ID:
            continue
        n = int(call.lengths[i])
        pool.conv_state[slot], pool.recurrent_state[slot] = states[i][n]
        pool.seq_len[slot] = call.pos[i] + n
    pool.warned = call.warned
