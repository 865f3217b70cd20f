"""Serving-engine call patterns on the Triton path: packed variable-length calls over a pool of state
slots, speculative verify and commit, prefix snapshots. The API is that of the float64 reference,
`reference/serving.py`: same names, argument order and results.

>>> pool = StatePool.for_layer(layer, size=16)  # conv [16, conv_dim, K], recurrent [16, Hv, dk, dv] fp32, seq_len
>>> out, trace = forward_packed(layer, pool, x, cu_seqlens=[0, 1, 65], seq_pos=[40, 0], slots=[3, 7])
>>> out, trace, spec = verify_spec(layer, pool, x_draft, cu_seqlens=[0, 4, 8], seq_pos=[41, 64], slots=[3, 7])
>>> commit(spec, accepted=[2, 4])
>>> out, trace, spec = forward_mixed(layer, pool, x, [0, 1, 9, 49], [7, 30, 0], [2, 3, 4], verify=[0, 1, 0])
>>> commit(spec, [0, 5, 0], snap_seq=[1], snap_offset=[3], snap_slot=[9])

Every function takes the Triton `Layer` first and any device `State` of the layer's dimensions,
device and profile as the pool; `out` is [total_tokens, D] in the profile dtype, the trace `{}`
unless `capture=True`. A layout given as device tensors is never read on the host (a CUDA graph
can capture the call), except by `strict=True`, `prefix_snapshots` and `commit`.

How a call runs, as an engine runs it: docs/serving.md §9; compile table and memory: docs/gpu.md §9.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

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
from gdncheck.errors import CuSeqlensError, InputError, InputShapeError, SpecCommitError

from .conv1d import conv1d_qk_norm_packed, conv_windows
from .delta_rule import delta_rule_recurrent_packed
from .delta_rule_chunked import CHUNK_SIZES, delta_rule_chunked_packed
from .gates import gates
from .layer import DELTA_RULE_FORMS, RECURRENT_MAX_TOKENS, Layer
from .packed import Packed, Snapshots, chunk_bound, chunk_map, every_token
from .state import State
from .target import empty, kernel, next_pow2

log = logging.getLogger("gdncheck.gpu_impl")


class StatePool(State):
    """``size`` slots of layer state on the device: conv_state [S, conv_dim, K] (activation dtype),
    recurrent_state [S, Hv, dk, dv] fp32, seq_len [S] int64. A :class:`State` whose rows are slots
    (every function here takes any State as a pool), zeros and ``seq_len = 0`` at first."""

    def __init__(self, cfg: GDNConfig, size: int, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        super().__init__(cfg, size, dtype=dtype, device=torch.device(device))

    @classmethod
    def for_layer(cls, layer: Layer, size: int) -> StatePool:
        """A pool in the layer's profile dtype, on its device."""
        return cls(layer.cfg, size, dtype=layer.dtype, device=layer.device)

    @property
    def size(self) -> int:
        return self.batch

    def free(self, slots) -> None:
        """Zero the given slots and set their seq_len to 0 (a finished request). Every id must be a
        slot, in ``[0, size)``; the padding id names none and is refused like any other
        (``slot_index``, docs/serving.md §3)."""
        self.reset(check_free_slots(slots, self.size, None))

    def __repr__(self) -> str:
        return f"StatePool(size={self.size}, seq_len={self.seq_len.tolist()}, device={self.device})"


@dataclass
class SpecVerify:
    """What :func:`verify_spec` keeps for :func:`commit`: the call's layout and the state after every
    token, on the device. Row ``cu_seqlens[i] + j - 1`` of the steps is sequence i after its first
    j tokens (padding sequences included: the states reached from zero, never committed)."""

    pool: State
    layer_index: int | None
    cu_seqlens: torch.Tensor  # int64 [N + 1], on the device like the rest
    seq_pos: torch.Tensor  # int64 [N]
    slots: torch.Tensor  # int64 [N]
    slot_seq_len: torch.Tensor  # int64 [N] on the device: each slot's seq_len when verified (-1 for padding)
    conv_state_steps: torch.Tensor  # [total_tokens, conv_dim, K], the conv state's dtype
    recurrent_state_steps: torch.Tensor  # fp32 [total_tokens, Hv, dk, dv]
    committed: bool = False

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.cu_seqlens.cpu().numpy())


@dataclass(frozen=True)
class _Call:
    """A checked call: x [1, total, D] on the device, the layout there, the host copy of it when the
    host gave it (else None), and the delta rule's form."""

    x: torch.Tensor
    cu: torch.Tensor
    pos: torch.Tensor
    slots: torch.Tensor
    host: dict[str, np.ndarray] | None  # cu, lengths, pos, slots
    form: str
    chunk: int
    max_len: int
    chunk_map: tuple[torch.Tensor, torch.Tensor, int] | None  # chunked form, host lengths: cu_chunks, order, count


# --- the four patterns ----------------------------------------------------------------------------
def forward_packed(layer: Layer, pool: State, x, cu_seqlens, seq_pos, slots, *, strict: bool | None = None,
                   delta_rule: str | None = None, chunk_size: int | None = None, capture: bool = False
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One packed call: each sequence as ``layer.forward`` on its slot. Returns ``(out, trace)``."""
    call = _prepare(layer, pool, x, cu_seqlens, seq_pos, slots, strict, delta_rule, chunk_size)
    packed = _apply_rule(pool, call, write=True)
    return _run(layer, pool, call, packed, capture, _Extras())


def prefix_snapshots(layer: Layer, pool: State, x, cu_seqlens, seq_pos, slots, snap_seq, snap_offset, snap_slot,
                     *, strict: bool | None = None, delta_rule: str | None = None, chunk_size: int | None = None,
                     capture: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`forward_packed`, and for each request m the state of sequence ``snap_seq[m]`` after its first
    ``snap_offset[m]`` tokens written to slot ``snap_slot[m]``, with ``seq_len = seq_pos + offset``.

    The requests are host values, checked against the layout (a device layout is read for that) and
    copied to the device in a copy of their own."""
    call = _prepare(layer, pool, x, cu_seqlens, seq_pos, slots, strict, delta_rule, chunk_size, host_layout=True)
    h = call.host
    seq, off, dest = check_snapshot_requests(snap_seq, snap_offset, snap_slot, h["lengths"], h["slots"], pool.batch,
                                             layer.layer_index)
    order = np.lexsort((off, seq))
    seq, off, dest = seq[order], off[order], dest[order]
    counts = np.bincount(seq, minlength=h["slots"].shape[0])
    cu_snap = np.concatenate([[0], np.cumsum(counts)])
    d_cu, d_seq, d_off, d_dest, d_len = _upload([cu_snap, seq, off, dest, h["pos"][seq] + off], call.x.device)
    packed = _apply_rule(pool, call, write=True)
    if dest.size:
        pool.seq_len.index_copy_(0, d_dest, d_len)
    ends = np.minimum((off + call.chunk - 1) // call.chunk * call.chunk, h["lengths"][seq])
    snaps = Snapshots(d_cu, d_seq, d_off, d_dest, inside=bool((off != ends).any()))
    return _run(layer, pool, call, packed, capture, _Extras(snapshots=snaps, conv_out=pool.conv_state,
                                                            rec_out=pool.recurrent_state))


def verify_spec(layer: Layer, pool: State, x, cu_seqlens, seq_pos, slots, *, strict: bool | None = None,
                delta_rule: str | None = None, chunk_size: int | None = None, capture: bool = False
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor], SpecVerify]:
    """Every draft token's output, and the state after each, without writing the pool (its warned flag
    and the warning aside). Returns ``(out, trace, spec)``; :func:`commit` ``(spec, accepted)`` writes
    the slots. The steps are kept on the device: [total, conv_dim, K] and fp32 [total, Hv, dk, dv].
    ``delta_rule="auto"`` is the recurrent form here, whose state after every token is at hand
    (the chunked form, if asked for, computes each inside its chunk)."""
    call = _prepare(layer, pool, x, cu_seqlens, seq_pos, slots, strict, delta_rule, chunk_size, auto="recurrent")
    packed = _apply_rule(pool, call, write=False)
    cfg, total, dev = layer.cfg, call.x.shape[1], call.x.device
    conv_steps = empty((total, cfg.conv_dim, cfg.conv_kernel), pool.conv_state.dtype, dev)
    rec_steps = empty((total, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim), torch.float32, dev)
    steps = every_token(packed.cu, total)  # every token, to its own row
    seen = torch.where(packed.slots >= 0, pool.seq_len[packed.slots.clamp(min=0)], -1)
    out, trace = _run(layer, pool, call, packed, capture, _Extras(snapshots=steps, conv_out=conv_steps,
                                                                   rec_out=rec_steps, store_final=False))
    spec = SpecVerify(pool, layer.layer_index, call.cu, call.pos, call.slots, seen, conv_steps, rec_steps)
    return out, trace, spec


@dataclass
class MixedVerify:
    """What :func:`forward_mixed` keeps for :func:`commit`: the verify of its verify rows (None when it
    has none) and where they sit among the call's sequences."""

    pool: State
    layer_index: int | None
    lengths: np.ndarray  # int64 [N]: the call's sequences
    slots: np.ndarray  # int64 [N]
    verify: np.ndarray  # bool [N]
    spec: SpecVerify | None  # the verify rows' own verify, in call order
    committed: bool = False


def forward_mixed(layer: Layer, pool: State, x, cu_seqlens, seq_pos, slots, verify, *, strict: bool | None = None,
                  delta_rule: str | None = None, chunk_size: int | None = None, capture: bool = False
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor], MixedVerify]:
    """A serving batch as engines schedule it: the rows with ``verify[i]`` true are speculative-verify rows
    (as :func:`verify_spec`), the others plain prefill and decode rows (as :func:`forward_packed`). As
    vLLM runs its spec and non-spec rows, the two kinds go through their own kernels: a verify of the
    verify rows (the recurrent kernel keeping every token's state) and a packed call of the others, each
    over its rows of the stream, gathered by token and scattered back. The layout is read on the host
    (it is split there). Returns ``(out, trace, spec)``; :func:`commit` commits the verify rows."""
    call = _prepare(layer, pool, x, cu_seqlens, seq_pos, slots, strict, delta_rule, chunk_size, host_layout=True)
    h = call.host
    rows = check_verify_rows(verify, h["slots"].shape[0], layer.layer_index)
    total, dev = call.x.shape[1], call.x.device
    out = torch.empty((total, layer.cfg.hidden_size), dtype=layer.dtype, device=dev)
    traces, spec = [], None
    # the verify rows first: they write nothing, so the plain rows' writes come after every read
    for kind in (True, False):
        seqs = np.flatnonzero(rows == kind)
        if not seqs.size:
            continue
        tokens = np.concatenate([np.arange(h["cu"][i], h["cu"][i + 1]) for i in seqs])
        sub_cu = np.concatenate([[0], np.cumsum(h["lengths"][seqs])])
        (where,) = _upload([tokens], dev)
        args = (layer, pool, call.x[0].index_select(0, where), sub_cu, h["pos"][seqs], h["slots"][seqs])
        opts = dict(strict=strict, delta_rule=delta_rule, chunk_size=chunk_size, capture=capture)
        if kind:
            sub_out, sub_trace, spec = verify_spec(*args, **opts)
        else:
            sub_out, sub_trace = forward_packed(*args, **opts)
        out.index_copy_(0, where, sub_out)
        traces.append((where, sub_trace))
    trace = {}
    for name in set.intersection(*(set(t) for _, t in traces)):
        first = traces[0][1][name]
        trace[name] = torch.empty((total, *first.shape[1:]), dtype=first.dtype, device=dev)
        for where, t in traces:
            trace[name].index_copy_(0, where, t[name])
    mixed = MixedVerify(pool, layer.layer_index, h["lengths"], h["slots"], rows, spec)
    return out, trace, mixed


def commit(spec: SpecVerify | MixedVerify, accepted, snap_seq=(), snap_offset=(), snap_slot=()) -> None:
    """Make each slot of a verify as if only its sequence's first ``accepted[i]`` tokens had been run
    (``seq_len = seq_pos + accepted``); ``accepted[i] = 0`` leaves the slot as it was. Once per verify;
    refused when a call since the verify moved one of its slots' seq_len. Snapshot request m writes
    sequence ``snap_seq[m]``'s state after ``snap_offset[m]`` (``1..accepted``) of its tokens to slot
    ``snap_slot[m]``. Of a :func:`forward_mixed` call: its plain rows take 0. It reads the layout and the
    slots' seq_len on the host (the one synchronisation of the pattern: it must refuse before writing)."""
    raw = accepted.cpu().numpy() if isinstance(accepted, torch.Tensor) else accepted
    if isinstance(spec, MixedVerify):
        n = check_accepted(raw, spec.lengths, spec.layer_index, spec.verify)
        seq, off, dest = check_commit_snapshots(snap_seq, snap_offset, snap_slot, n, spec.slots, spec.pool.batch,
                                                spec.layer_index)
        if spec.committed or spec.spec is None:
            if spec.committed:
                raise SpecCommitError("expected one commit per verify_spec, found this verify already committed",
                                      layer=spec.layer_index)
            spec.committed = True
            return
        inner = np.cumsum(spec.verify) - 1  # a verify row's index among the verify rows
        commit(spec.spec, n[spec.verify], inner[seq], off, dest)
        spec.committed = True
        return
    pool, where = spec.pool, spec.layer_index
    lengths = spec.lengths
    n = check_accepted(raw, lengths, where)
    cu, pos, slots = (t.cpu().numpy() for t in (spec.cu_seqlens, spec.seq_pos, spec.slots))
    seq, off, dest = check_commit_snapshots(snap_seq, snap_offset, snap_slot, n, slots, pool.batch, where)
    if spec.committed:
        raise SpecCommitError("expected one commit per verify_spec, found this verify already committed",
                              layer=where)
    real = slots != PAD_SLOT_ID
    now = np.where(real, pool.seq_len.cpu().numpy()[np.where(real, slots, 0)], -1)
    moved = np.flatnonzero(now != spec.slot_seq_len.cpu().numpy())
    if moved.size:
        i = int(moved[0])
        raise SpecCommitError(f"expected slot {slots[i]} (sequence {i}) at the seq_len it had when verified "
                              f"({int(spec.slot_seq_len[i])}), found {now[i]}: another call moved it", layer=where)
    keep = np.flatnonzero(real & (n > 0))
    # the accepted states, then the prefix snapshots inside the accepted windows: rows of the steps
    rows = np.concatenate([cu[keep] + n[keep] - 1, cu[seq] + off - 1])
    dests = np.concatenate([slots[keep], dest])
    lens = np.concatenate([pos[keep] + n[keep], pos[seq] + off])
    if rows.size:
        d_rows, d_dest, d_lens = _upload([rows, dests, lens], pool.device)
        pool.conv_state.index_copy_(0, d_dest, spec.conv_state_steps.index_select(0, d_rows))
        pool.recurrent_state.index_copy_(0, d_dest, spec.recurrent_state_steps.index_select(0, d_rows))
        pool.seq_len.index_copy_(0, d_dest, d_lens)
    spec.committed = True


# --- the seq-len rule on the device -----------------------------------------------------------------
@kernel
def slot_rule_kernel(p_cu, p_slots, p_pos, p_seq_len, p_reset, p_report, N, BN: tl.constexpr, WRITE: tl.constexpr):
    """The seq-len rule per slot (docs/serving.md §2) for sequences n of a packed call: reset[n] = 1
    where slot s = slots[n] is real and seq_len[s] != pos[n] (its state is then read as zeros);
    report [3, N]: that old seq_len where reset (else -1), pos, the slot. WRITE: seq_len[s] =
    pos[n] + (cu[n+1] - cu[n]), once read (each real slot appears once per call). The padding id
    -1 is tested before it indexes anything. Grid: (cdiv(N, BN),)."""
    o_n = tl.program_id(0) * BN + tl.arange(0, BN)
    m_n = o_n < N
    slot = tl.load(p_slots + o_n, mask=m_n, other=-1)
    pos = tl.load(p_pos + o_n, mask=m_n, other=0)
    real = slot >= 0
    o_slot = tl.maximum(slot, 0)
    seen = tl.load(p_seq_len + o_slot, mask=real, other=0)
    reset = real & (seen != pos)
    tl.store(p_reset + o_n, reset.to(tl.uint8), mask=m_n)
    tl.store(p_report + o_n, tl.where(reset, seen, -1), mask=m_n)
    tl.store(p_report + N + o_n, pos, mask=m_n)
    tl.store(p_report + 2 * N + o_n, slot, mask=m_n)
    if WRITE:
        length = tl.load(p_cu + o_n + 1, mask=m_n, other=0) - tl.load(p_cu + o_n, mask=m_n, other=0)
        tl.store(p_seq_len + o_slot, pos + length, mask=real)


def _apply_rule(pool: State, call: _Call, *, write: bool) -> Packed:
    """Run the seq-len rule on the device, queue its warning, and return the call's layout."""
    N, dev = int(call.slots.shape[0]), call.x.device
    reset = empty((N,), torch.uint8, dev)
    report = empty((3, N), torch.int64, dev)
    BN = min(next_pow2(N), 1024)
    slot_rule_kernel[(triton.cdiv(N, BN),)](p_cu=call.cu, p_slots=call.slots, p_pos=call.pos, p_seq_len=pool.seq_len,
                                            p_reset=reset, p_report=report, N=N, BN=BN, WRITE=write)
    pool.queue_slot_report(report)
    total = call.x.shape[1]
    if call.form == "recurrent":
        return Packed(call.cu, call.slots, reset, total, call.max_len)
    if call.chunk_map is not None:
        cu_chunks, order, n_chunks = call.chunk_map
    else:
        (cu_chunks, order), n_chunks = chunk_map(call.cu, call.chunk), chunk_bound(total, N, call.chunk)
    return Packed(call.cu, call.slots, reset, total, call.max_len, call.chunk, cu_chunks, n_chunks, order)


# --- computing --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Extras:
    """States a call keeps besides its final ones: ``snapshots`` to rows of ``conv_out`` and
    ``rec_out``; ``store_final`` False for a verify (no slot written)."""

    snapshots: Snapshots | None = None
    conv_out: torch.Tensor | None = None
    rec_out: torch.Tensor | None = None
    store_final: bool = True


def _run(layer: Layer, pool: State, call: _Call, packed: Packed, capture: bool, extras: _Extras):
    cfg = layer.cfg

    def mixer(qkv, a, b):
        # the requested conv windows read the entering states: before the final ones are written
        if extras.snapshots is not None:
            conv_windows(qkv, pool.conv_state, packed, extras.conv_out, extras.snapshots)
        q, k, v, qkv_conv = conv1d_qk_norm_packed(qkv, pool.conv_state, layer.w_conv, cfg.num_k_heads,
                                                  cfg.head_k_dim, cfg.num_v_heads, cfg.head_v_dim, packed,
                                                  capture=capture, store_final=extras.store_final)
        g, beta = gates(a, b, layer.A_log, layer.dt_bias)
        rule = delta_rule_recurrent_packed if call.form == "recurrent" else delta_rule_chunked_packed
        core = rule(q, k, v, g, beta, pool.recurrent_state, cfg.scale, packed, store_final=extras.store_final,
                    snapshots=extras.snapshots, snap_out=extras.rec_out)
        return q, k, v, qkv_conv, g, beta, core

    pool.flush_warnings(log, layer.layer_index)
    out, trace = layer._run(call.x, pool, packed.reset, call.form, call.chunk, capture, mixer=mixer)
    pool.flush_warnings(log, layer.layer_index)
    return out[0], {name: t[0] for name, t in trace.items()}


# --- checking ---------------------------------------------------------------------------------------
def _prepare(layer: Layer, pool: State, x, cu_seqlens, seq_pos, slots, strict: bool | None, delta_rule: str | None,
             chunk_size: int | None, *, host_layout: bool = False, auto: str | None = None) -> _Call:
    """Every check of the call (before anything is written), and its layout on the device.

    ``host_layout``: read a device layout on the host (its values are needed there). ``auto``: the
    form ``delta_rule="auto"`` takes (default: recurrent when no sequence is longer than
    RECURRENT_MAX_TOKENS, else chunked)."""
    where = layer.layer_index
    if not isinstance(pool, State):
        raise InputError(f"expected a gpu_impl State or StatePool as the pool, found {type(pool).__name__}",
                         layer=where)
    if pool.fingerprint != layer.cfg.state_fingerprint():
        raise InputShapeError(f"expected a pool of this layer's state dimensions ({layer.cfg.state_fingerprint()}), "
                              f"found {pool.fingerprint}", layer=where)
    if pool.device != layer.device or pool.conv_state.dtype != layer.dtype:
        raise InputError(f"expected a pool on the layer's device ({layer.device}) in its dtype ({layer.dtype}), "
                         f"found one on {pool.device} in {pool.conv_state.dtype}", layer=where)
    if isinstance(x, torch.Tensor):
        ok, dtype, shape = x.is_floating_point(), x.dtype, tuple(x.shape)
    else:
        x = np.asarray(x)
        ok, dtype, shape = x.dtype.kind == "f", x.dtype, x.shape
    check_packed_x(shape, ok, dtype, layer.cfg, where, accepted="float16/32/64, bfloat16")
    total = shape[0]
    form = delta_rule or layer.delta_rule
    if form not in DELTA_RULE_FORMS:
        raise ValueError(f"delta_rule must be one of {DELTA_RULE_FORMS}, found {form!r}")
    chunk = chunk_size or layer.chunk_size
    if chunk not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}, found {chunk!r}")
    strict = layer.strict if strict is None else strict
    dev = layer.device

    def on_device(t) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type != "cpu" and not host_layout

    def host(t) -> np.ndarray:
        return t.cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)

    # host values are checked and gathered for one copy; device tensors are checked by shape and dtype
    uploads: dict[str, np.ndarray] = {}
    on_dev: dict[str, torch.Tensor] = {}
    lengths = None
    if on_device(cu_seqlens):
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2 or not _integral(cu_seqlens):
            raise CuSeqlensError(f"expected cu_seqlens as a 1-D integer tensor of N + 1 >= 2 offsets, found a "
                                 f"{cu_seqlens.dtype} tensor of shape {list(cu_seqlens.shape)}", layer=where)
        on_dev["cu"] = cu_seqlens.to(device=dev, dtype=torch.int64)
        n = cu_seqlens.shape[0] - 1
    else:
        uploads["cu"], lengths = check_cu_seqlens(host(cu_seqlens), total, where)
        n = lengths.shape[0]
    if on_device(seq_pos):
        if not _integral(seq_pos) or seq_pos.dim() > 1 or (seq_pos.dim() == 1 and seq_pos.shape[0] != n):
            raise InputShapeError(f"expected seq_pos as an int or {n} ints (one per sequence), found a "
                                  f"{seq_pos.dtype} tensor of shape {list(seq_pos.shape)}", layer=where)
        on_dev["pos"] = seq_pos.to(device=dev, dtype=torch.int64).expand(n).contiguous()
    else:
        uploads["pos"] = check_seq_pos(seq_pos, host(seq_pos), n, where)
    if on_device(slots):
        if not _integral(slots) or slots.dim() != 1 or slots.shape[0] != n:
            raise InputShapeError(f"expected slots as {n} ints (one per sequence), found a {slots.dtype} tensor of "
                                  f"shape {list(slots.shape)}", layer=where)
        on_dev["slots"] = slots.to(device=dev, dtype=torch.int64)
    else:
        uploads["slots"] = check_slots(host(slots), n, pool.batch, where)
    if strict:  # must raise before anything changes: reads the pool (and a device layout) on the host
        pos_h, slots_h = (uploads[k] if k in uploads else host(on_dev[k]) for k in ("pos", "slots"))
        slots_to_reset(pos_h, slots_h, pool.seq_len.cpu().numpy(), strict=True, warned=pool.warned, layer=where,
                       logger=log)
    max_len = int(lengths.max()) if lengths is not None else total - n + 1
    if form == "auto":
        form = auto or ("recurrent" if max_len <= RECURRENT_MAX_TOKENS else "chunked")
    maps = None
    if form == "chunked" and lengths is not None:  # the chunk map travels with the layout
        chunks = (lengths + chunk - 1) // chunk
        uploads["cu_chunks"] = np.concatenate([[0], np.cumsum(chunks)])
        uploads["order"] = np.argsort(-lengths, kind="stable")
        maps = int(chunks.sum())
    on_dev.update(zip(uploads, _upload(list(uploads.values()), dev)))
    if maps is not None:
        maps = (on_dev["cu_chunks"], on_dev["order"], maps)
    host_view = None
    if lengths is not None and "pos" in uploads and "slots" in uploads:
        host_view = {"cu": uploads["cu"], "lengths": lengths, "pos": uploads["pos"], "slots": uploads["slots"]}
    xt = torch.as_tensor(x).to(device=dev, dtype=layer.dtype).reshape(1, total, -1).contiguous()
    return _Call(xt, on_dev["cu"], on_dev["pos"], on_dev["slots"], host_view, form, chunk, max_len, maps)


def _integral(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _upload(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Host int arrays as int64 tensors on ``device``, in one copy (from pinned memory on CUDA)."""
    if not arrays:
        return []
    sizes = [int(np.asarray(a).size) for a in arrays]
    host = torch.from_numpy(np.concatenate([np.asarray(a, dtype=np.int64).ravel() for a in arrays]))
    if device.type == "cuda":
        host = host.pin_memory()
    dev = host.to(device, non_blocking=device.type == "cuda")
    return list(torch.split(dev, sizes))
